"""A policy tree other than the bundled one (``--policies``, ``$CKPTGATE_POLICIES``, a configuration's
``policies``, in ``ckptgate check`` the change under review's) decides, but never reaches past the
inputs the decision names, and never governs the embedded engine itself."""

from __future__ import annotations

import http.server
import json
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from ckptgate.decide.bundle import find_opa, read_policy_files
from ckptgate.decide.engine import EmbeddedOpa
from ckptgate.decide.options import EngineOptions, engine_for
from ckptgate.decide.policy_tree import AUTHZ_IN_BUNDLE, engine_overlays
from ckptgate.errors import EngineUnavailable, ExitCode, UsageError
from tests.opa_front import tcp_front

REPO = Path(__file__).resolve().parents[2]
POLICIES = REPO / "policies"
HF = REPO / "tests" / "fixtures" / "data" / "hf_sharded" / "checkpoint"

try:
    find_opa()
except EngineUnavailable:  # pragma: no cover - the development clone pins one
    pytest.skip("no OPA binary here", allow_module_level=True)

_SEND = 'http.send({"method": "get", "url": "URL"})'
_ARG = '{"method": "get", "url": "URL"}'
# (case id, module text): each added to a copy of the bundled tree, in a package of its own
NONDETERMINISTIC = [
    ("http.send in a rule the decision reads", f"x := r if {{\n\tr := {_SEND}.raw_body\n}}\n"),
    ("http.send in a comprehension", f"x := [r | r := {_SEND}]\n"),
    ("http.send as a with value", f"f(v) := v\n\nx := r if {{\n\tr := f({_ARG}) with f as http.send\n}}\n"),
    ("http.send named by brackets", f'f(v) := v\n\nx := r if {{\n\tr := f({_ARG}) with f as http["send"]\n}}\n'),
    ("opa.runtime", "x := opa.runtime().env\n"),
    ("net.lookup_ip_addr", 'x if net.lookup_ip_addr("exfil.example")\n'),
    ("time.now_ns", "x if time.now_ns() > 0\n"),
    ("rand.intn", 'x := rand.intn("a", 10)\n'),
    ("json.match_schema (a remote $ref)", 'x := json.match_schema({}, {"$ref": "URL"})\n'),
    # verified as of now: a certificate with a NotAfter of the author's choosing flips the decision then
    ("an x509 chain verified as of now", "x if crypto.x509.parse_and_verify_certificates(input.pem)[0]\n"),
]
BUILTINS = ("http.send", "opa.runtime", "net.lookup_ip_addr", "time.now_ns", "rand.intn", "json.match_schema",
            "crypto.x509.parse_and_verify_certificates")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    out = tmp_path / "policies"
    shutil.copytree(POLICIES, out, ignore=shutil.ignore_patterns(".regal"))
    return out


@pytest.fixture
def listener() -> Iterator[tuple[str, list[str]]]:
    """A local HTTP server that records every request it receives."""
    seen: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            seen.append(self.path)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/latest/meta-data/", seen
    server.shutdown()


def _open(tree: Path) -> None:
    with engine_for(EngineOptions(policy_dir=tree)) as engine:
        engine.evaluate("ckptgate/intake/decision", {})


@pytest.mark.parametrize("body", [c[1] for c in NONDETERMINISTIC], ids=[c[0] for c in NONDETERMINISTIC])
def test_a_tree_that_calls_a_nondeterministic_builtin_is_refused_before_the_engine_runs(tree, listener, body):
    url, seen = listener
    module = tree / "ckptgate" / "exfil" / "exfil.rego"
    module.parent.mkdir()
    module.write_text("package ckptgate.exfil\n\n" + body.replace("URL", url))
    with pytest.raises(UsageError) as e:
        _open(tree)
    assert e.value.code == "usage.policies"
    assert e.value.evidence["file"] == str(module)
    assert e.value.evidence["builtin"] == next(name for name in BUILTINS if name.split(".")[0] in body)
    assert seen == []  # nothing reached the network


def test_the_same_tree_without_the_call_decides(tree):
    module = tree / "ckptgate" / "extra" / "extra.rego"
    module.parent.mkdir()
    module.write_text('package ckptgate.extra\n\nx := "deterministic"\n')
    assert engine_overlays(tree, read_policy_files(tree)) == {AUTHZ_IN_BUNDLE: (POLICIES / AUTHZ_IN_BUNDLE).read_bytes()}
    _open(tree)


def test_the_bundled_tree_and_an_identical_copy_are_loaded_as_they_are(tree):
    assert engine_overlays(POLICIES, read_policy_files(POLICIES)) == {}
    assert engine_overlays(tree, read_policy_files(tree)) == {}


@pytest.mark.parametrize(
    ("rel", "text"),
    [
        ("system/log/mask.rego", "package system.log\n\nmask contains \"/input\"\n"),
        ("ckptgate/x/authz.rego", "package system.authz\n\nallow if true\n"),
        ("ckptgate/x/brackets.rego", 'package system["authz"]\n\nallow if true\n'),
        ("system/authz/data.json", '{"allow": true}'),
        ("data.json", '{"system": {"authz": {"allow": true}}}'),
        ("data.json", '{"\\u0073ystem": {"log": {"mask": ["/input"]}}}'),
        # OPA's decoder reads a stray byte as U+FFFD and loads data.system.log.mask; Python's refuses the file
        ("data.json", b'{"system": {"log": {"mask": ["/input"]}}, "pad": "\xff"}'),
        ("data.json", '{"x": ' + "[" * 5000 + "]" * 5000 + "}"),
    ],
    ids=["system.log", "system.authz elsewhere", "system by brackets", "data under system/", "a system key",
         "an escaped system key", "a stray byte", "nested past Python's depth"],
)
def test_a_tree_that_defines_the_engines_namespace_is_refused(tree, rel, text):
    path = tree / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(UsageError) as e:
        _open(tree)
    assert e.value.code == "usage.policies" and e.value.evidence["file"] == str(path)


@pytest.mark.parametrize(
    "body",
    [
        "import data.system.bundles\n\nx := object.keys(bundles)\n",
        'x := data.system.version\n',
        'x := data["system"]\n',
        "x := data\n",
        "x := [p | walk(data, [p, _])]\n",
        'x := data[k] if k := concat("", ["sys", "tem"])\n',
        "import data as d\n\nx := d.system\n",
        'x := y if {\n\ty := 1 with data.system.version as {}\n}\n',
    ],
    ids=["an import", "a reference", "brackets", "all of data", "walk", "a computed key", "an alias of data",
         "a with target"],
)
def test_a_tree_that_reads_the_engines_namespace_is_refused(tree, body):
    """data.system.bundles is keyed by the engine's private work directory, opa-<128 random bits>: a coin
    a policy could toss, and the uid and runtime path besides."""
    module = tree / "ckptgate" / "peek" / "peek.rego"
    module.parent.mkdir()
    module.write_text("package ckptgate.peek\n\n" + body)
    with pytest.raises(UsageError) as e:
        _open(tree)
    assert e.value.code == "usage.policies" and e.value.evidence["file"] == str(module)


def test_reading_data_by_name_is_allowed(tree):
    module = tree / "ckptgate" / "named" / "named.rego"
    module.parent.mkdir()
    module.write_text("package ckptgate.named\n\nx := data.ckptgate.config\n\ny := data.ckptgate[k] if k := \"config\"\n")
    assert engine_overlays(tree, read_policy_files(tree))


def test_without_policies_of_its_own_an_installation_refuses_any_other_tree(tree, monkeypatch):
    """No authorization of ckptgate's own to stage (a zip-imported install has no policies directory):
    a tree is refused rather than run behind its own system.authz, unchecked."""
    import ckptgate.decide.policy_tree as pt

    monkeypatch.setattr(pt, "policies_dir", lambda: None)
    with pytest.raises(UsageError) as e:
        engine_overlays(tree, read_policy_files(tree))
    assert e.value.code == "usage.policies" and str(tree) in e.value.message


def _anonymous(port: int) -> tuple[int, int]:
    base = f"http://127.0.0.1:{port}/v1"
    read = requests.post(f"{base}/data/ckptgate/intake/decision", json={"input": {}}, timeout=5)
    put = requests.put(f"{base}/policies/x", data=b"package x\n", timeout=5)
    return read.status_code, put.status_code


def test_a_tree_whose_authz_admits_anyone_runs_behind_ckptgates_own(tree):
    (tree / AUTHZ_IN_BUNDLE).write_text("package system.authz\n\nallow := true\n")
    with engine_for(EngineOptions(policy_dir=tree)) as engine:
        engine.evaluate("ckptgate/intake/decision", {})  # started
        with tcp_front(engine) as port:
            assert _anonymous(port) == (401, 401)
    # the control: that tree's own authz, loaded as it is, admits anyone (the write then fails on its own
    # merits, 400: the bundle owns every root)
    with EmbeddedOpa(policy_dir=tree) as opa, tcp_front(opa) as port:
        assert _anonymous(port) == (200, 400)


def test_the_cli_refuses_such_a_tree_with_a_usage_error(tree, listener, tmp_path):
    url, seen = listener
    (tree / "ckptgate" / "intake" / "exfil.rego").write_text(
        f"package ckptgate.intake\n\n_exfil := r if {{\n\tr := {_SEND.replace('URL', url)}\n}}\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "ckptgate", "decide", str(HF), "--policies", str(tree), "--isolated", "--json"],
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "CKPTGATE_OPA": find_opa()},
        cwd=tmp_path, capture_output=True, text=True, timeout=180, check=False,
    )
    assert out.returncode == ExitCode.USAGE, out.stdout + out.stderr
    assert json.loads(out.stdout)["error"]["code"] == "usage.policies"
    assert "Traceback" not in out.stderr and seen == []
