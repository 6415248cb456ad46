"""``ckptgate check`` runs the policy tools on the change under review without letting it run code of
its own, reach the network or read the CI environment: no tool from the judged repository's
``.tools/bin``, no extra Rego through a linked directory, no Regal configuration or custom rules from
the repository, no network builtin in ``opa test``, and an environment of ``PATH``, a private ``HOME``
and ``TZ=UTC``."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from ckptgate.config import Config
from ckptgate.decide.extra_rego import extra_rego_files
from ckptgate.decide.options import EngineOptions
from ckptgate.errors import ConfigError
from ckptgate.evidence import check, check_tools
from ckptgate.evidence.check import run_check

NOT_TOOLS = ("matrix_drift", "gate_drift", "evidence", "claims")
GATES = 'package ckptgate_consumer\n\ndeny contains {"code": "x", "message": "y"} if input.never\n'


class _Listener:
    """A local HTTP server that records the path of every request it receives."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        hits = self.hits

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                hits.append(self.path)
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            do_POST = do_GET

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def listener() -> Iterator[_Listener]:
    lst = _Listener()
    yield lst
    lst.server.shutdown()
    lst.server.server_close()


@pytest.fixture(autouse=True)
def _no_git(monkeypatch) -> None:
    monkeypatch.setattr(check, "candidate_commit", lambda repo, exclude=(): "0" * 40)


def _needs(*tools: str) -> None:
    for tool in tools:
        if check_tools.find_tool(tool, Path.cwd()) is None:
            pytest.skip(f"{tool} is not installed")


def _tools_only(repo: Path, config: Config, *, skip: tuple[str, ...] = ()):
    return run_check(repo, options=EngineOptions(), config=config, skip=NOT_TOOLS + skip)


def _calls(url: str, what: str) -> str:
    return f'http.send({{"method": "GET", "url": "{url}/{what}", "raise_error": false}})'


def test_a_tool_in_the_judged_repositorys_tools_bin_is_never_found_or_run(tmp_path: Path, monkeypatch) -> None:
    """A committed ``.tools/bin/regal`` ran (``regal version``) where no Regal was on PATH."""
    marker = tmp_path / "ran"
    tool = tmp_path / "repo" / ".tools" / "bin" / "regal"
    tool.parent.mkdir(parents=True)
    tool.write_text(f"#!/bin/sh\ntouch {marker}\necho 'Version: 0.38.1'\n")
    tool.chmod(0o755)
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("CKPTGATE_REGAL", raising=False)
    monkeypatch.setattr(check_tools, "clone_tool", lambda name: None)
    assert check_tools.find_tool("regal", tmp_path / "repo") is None
    assert check_tools.version_skip_reason("regal_lint", tmp_path / "repo") is None
    assert not marker.exists()


def _repo_with_extra(tmp_path: Path) -> tuple[Path, Path]:
    repo = tmp_path / "repo"
    extra = repo / "policy"
    extra.mkdir(parents=True)
    (extra / "gates.rego").write_text(GATES)
    return repo, extra


def test_a_linked_directory_in_extra_rego_is_refused_and_never_run(tmp_path: Path, listener: _Listener) -> None:
    """``opa test`` on the directory followed a link the checker never read into: its test reached the network."""
    _needs("opa")
    repo, extra = _repo_with_extra(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "evil_test.rego").write_text(
        f"package ckptgate_consumer.evil\n\ntest_evil if {{\n\t{_calls(listener.url, 'linked')}\n}}\n"
    )
    (extra / "linked").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ConfigError) as e:
        extra_rego_files(extra)
    assert e.value.code == "usage.config.extra_rego" and str(extra / "linked") in e.value.message
    assert str(extra / "linked") in e.value.diagnostics()
    report = _tools_only(repo, Config(root=repo, extra_rego=extra))
    (result,) = report.results
    assert result.name == "policy_tests" and not result.passed
    assert [(f.code, f.file) for f in result.findings] == [("usage.config.extra_rego", "policy/linked")]
    assert listener.hits == []


def test_the_tools_run_on_a_staged_copy_of_the_checked_extra_rego(tmp_path: Path, monkeypatch) -> None:
    """Never in the work tree: a data file there is not loaded, and only the bytes checked are run."""
    _needs("opa")
    repo, extra = _repo_with_extra(tmp_path)
    (extra / "gates_test.rego").write_text("package ckptgate_consumer\n\ntest_ok if true\n")
    (extra / "data.json").write_text('{"planted": 1}')
    seen: list[tuple[str, Path, dict[str, bytes]]] = []

    def fake_run(cmd, cwd):
        if cmd[1] == "capabilities":
            return 0, '{"builtins": [{"name": "http.send"}]}'
        files = {p.relative_to(cwd).as_posix(): p.read_bytes() for p in Path(cwd).rglob("*") if p.is_file()}
        seen.append((cmd[1], Path(cwd), files))
        return 0, "[]"

    monkeypatch.setattr(check_tools, "_run", fake_run)
    monkeypatch.setattr(check_tools, "tool_version", lambda exe: check_tools.GO_TOOLS[Path(exe).name].version)
    monkeypatch.setattr(check_tools, "find_tool", lambda name, repo: name)
    monkeypatch.setattr(check, "version_skip_reason", lambda name, repo: None)
    report = _tools_only(repo, Config(root=repo, extra_rego=extra))
    assert [r.name for r in report.results] == ["policy_tests", "opa_fmt", "regal_lint"]
    assert [s[0] for s in seen] == ["test", "fmt", "lint"]
    checked = {"gates.rego": GATES.encode(), "gates_test.rego": b"package ckptgate_consumer\n\ntest_ok if true\n"}
    for _, cwd, files in seen:
        assert not cwd.resolve().is_relative_to(repo.resolve())
        assert files == checked


def _custom_rule(url: str) -> str:
    return (
        "# METADATA\n# description: evil\npackage custom.regal.rules.naming.evil\n\n"
        f"report contains violation if {{\n\t{_calls(url, 'regal')}\n\tviolation := {{}}\n\tfalse\n}}\n"
    )


@pytest.mark.parametrize("where", ["repository", "policy tree"])
def test_regal_never_loads_the_repositorys_configuration_or_custom_rules(
    tmp_path: Path, listener: _Listener, where: str
) -> None:
    """A committed ``.regal/rules/evil.rego`` ran during ``regal lint`` and reached the network."""
    _needs("opa", "regal")
    repo, extra = _repo_with_extra(tmp_path)
    regal_dir = (repo if where == "repository" else extra) / ".regal"
    (regal_dir / "rules").mkdir(parents=True)
    (regal_dir / "rules" / "evil.rego").write_text(_custom_rule(listener.url))
    (regal_dir / "config.yaml").write_text("rules:\n  custom:\n    evil:\n      level: error\n")
    config = Config(root=repo, extra_rego=extra) if where == "repository" else Config(root=repo, policies=extra)
    report = _tools_only(repo, config, skip=("policy_tests", "opa_fmt"))
    assert [r.name for r in report.results] == ["regal_lint"]
    assert listener.hits == []


def test_opa_test_on_a_judged_policy_tree_has_no_network_and_no_ci_environment(
    tmp_path: Path, listener: _Listener, monkeypatch
) -> None:
    """``policies = "pol"`` in a changed configuration: its tests run, but ``http.send`` does not
    compile and ``opa.runtime().env`` holds only ``PATH``, ``HOME`` and ``TZ`` (``UTC``)."""
    _needs("opa")
    monkeypatch.setenv("CKPTGATE_TEST_CI_SECRET", "s3cret")
    repo = tmp_path / "repo"
    pol = repo / "pol"
    pol.mkdir(parents=True)
    (pol / "env_test.rego").write_text(
        "package pol.env\n\ntest_env_is_minimal if {\n"
        '\tobject.keys(opa.runtime().env) == {"PATH", "HOME", "TZ"}\n'
        '\tnot startswith(opa.runtime().env.HOME, "/root")\n}\n'
    )
    (pol / "evil_test.rego").write_text(f"package pol.evil\n\ntest_evil if {{\n\t{_calls(listener.url, 'opa')}\n}}\n")
    report = _tools_only(repo, Config(root=repo, policies=pol), skip=("opa_fmt", "regal_lint"))
    (result,) = report.results
    assert not result.passed
    detail = " ".join(f"{f.message} {f.detail}" for f in result.findings)
    assert "http.send" in detail
    assert listener.hits == []
    (pol / "evil_test.rego").unlink()
    (result,) = _tools_only(repo, Config(root=repo, policies=pol), skip=("opa_fmt", "regal_lint")).results
    assert result.passed, [f.message for f in result.findings]


def test_a_json_schema_remote_ref_in_a_judged_policy_tree_is_never_fetched(tmp_path: Path, listener: _Listener) -> None:
    """``json.match_schema`` stays (the bundled config tests use it), but no host is allowed: a test whose
    schema has a remote ``$ref`` fails instead of reaching the network."""
    _needs("opa")
    repo = tmp_path / "repo"
    pol = repo / "pol"
    pol.mkdir(parents=True)
    (pol / "schema_test.rego").write_text(
        f'package pol.schema\n\ntest_ref if {{\n\tjson.match_schema({{}}, {{"$ref": "{listener.url}/schema"}})\n}}\n'
    )
    (result,) = _tools_only(repo, Config(root=repo, policies=pol), skip=("opa_fmt", "regal_lint")).results
    assert not result.passed
    assert listener.hits == []


def test_the_bundled_policies_pass_their_tests_without_the_network_builtins(tmp_path: Path) -> None:
    _needs("opa")
    policies = check.default_policy_dir()
    result = check_tools.policy_tests(policies, tmp_path)
    assert result.passed, [(f.message, f.detail) for f in result.findings][:5]


def test_the_capabilities_drop_exactly_the_network_builtins(tmp_path: Path) -> None:
    _needs("opa")
    opa = check_tools.find_tool("opa", tmp_path)
    assert opa is not None
    caps = check_tools.capabilities_without_network(opa, tmp_path)
    assert caps is not None
    names = {b["name"] for b in json.loads(caps.read_text())["builtins"]}
    assert not names & {"http.send", "net.lookup_ip_addr"}
    assert {"opa.runtime", "time.now_ns", "json.match_schema"} <= names
    assert json.loads(caps.read_text())["allow_net"] == []


def test_a_linked_file_in_a_judged_policy_tree_is_never_read(tmp_path: Path) -> None:
    """``opa test`` and ``opa fmt`` ran in the work tree's policy tree: ``leak.rego -> /outside/secret`` was
    quoted in OPA's parse error (the finding's detail), and a linked ``x.json`` was loaded as data."""
    _needs("opa")
    secret = tmp_path / "outside" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("root:x:0:0:S3CRET-LINE\n")
    repo = tmp_path / "repo"
    pol = repo / "pol"
    pol.mkdir(parents=True)
    (pol / "ok_test.rego").write_text("package pol.ok\n\ntest_ok if true\n")
    (pol / "leak.rego").symlink_to(secret)
    (pol / "leak.json").symlink_to(secret)
    report = _tools_only(repo, Config(root=repo, policies=pol), skip=("regal_lint",))
    assert [r.name for r in report.results] == ["policy_tests", "opa_fmt"]
    shown = json.dumps([[f.message, f.detail, f.file] for r in report.results for f in r.findings])
    assert "S3CRET" not in shown and "root:x" not in shown
    assert report.results[0].passed, shown  # the linked files are not loaded: ok_test.rego runs alone
