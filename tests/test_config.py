"""The repository configuration: discovery from the cwd up to the git root, validation with typed
``usage.config.*`` errors, ``ckptgate init``, and what ``check`` enables from it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ckptgate import config as cfg
from ckptgate.config.template import INIT_TEMPLATE
from ckptgate.decide.extra_rego import extra_rego_overlays
from ckptgate.errors import ExitCode
from ckptgate.evidence.check import CHECK_NAMES, plan

REPO = Path(__file__).resolve().parent.parent


def ckptgate(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTGATE_")}
    return subprocess.run([sys.executable, "-m", "ckptgate", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120, check=False)


def git_repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / ".git").mkdir(parents=True)
    return root


def test_discovery_walks_up_to_the_git_root_and_prefers_ckptgate_toml(tmp_path):
    root = git_repo(tmp_path)
    deep = root / "a" / "b"
    deep.mkdir(parents=True)
    assert cfg.discover(deep) is None
    (root / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert cfg.discover(deep) is None  # a pyproject.toml without [tool.ckptgate] is not a configuration
    (root / "pyproject.toml").write_text('[tool.ckptgate]\ndocs = ["*.md"]\n')
    assert cfg.discover(deep) == root / "pyproject.toml"
    (root / "a" / "ckptgate.toml").write_text("")
    assert cfg.discover(deep) == root / "a" / "ckptgate.toml"
    (root / "ckptgate.toml").write_text("")
    assert cfg.discover(root) == root / "ckptgate.toml"  # beside pyproject.toml, ckptgate.toml wins
    assert cfg.load(deep).root == root / "a"


def test_discovery_stops_at_the_git_root(tmp_path):
    (tmp_path / "ckptgate.toml").write_text("")
    root = git_repo(tmp_path)
    assert cfg.discover(root) is None


def test_paths_are_resolved_against_the_file_and_defaults_apply(tmp_path):
    root = git_repo(tmp_path)
    (root / "trust.json").write_text("{}")
    (root / "ckptgate.toml").write_text('trust = "trust.json"\n')
    c = cfg.load(root)
    assert c.trust == root / "trust.json" and c.docs == cfg.DEFAULT_DOCS
    assert c.matrix is None and c.fixtures is None and c.extra_rego is None and c.policies is None
    (root / "docs" / "sub").mkdir(parents=True)
    (root / "docs" / "sub" / "a.md").write_text("a")
    (root / "README.md").write_text("r")
    (root / "notes.txt").write_text("n")
    assert c.doc_files() == [root / "README.md", root / "docs" / "sub" / "a.md"]


@pytest.mark.parametrize(("text", "code"), [
    ("trust = [", "usage.config.syntax"),
    ("trsut = 'x'", "usage.config.unknown_key"),
    ("docs = 'README.md'", "usage.config.schema"),
    ("docs = [1]", "usage.config.schema"),
    ("trust = 'missing.json'", "usage.config.path"),
    ("trust = '../outside.json'", "usage.config.path"),
    ("trust = '/etc/passwd'", "usage.config.path"),
    ("matrix = '../elsewhere'\nfixtures = 'tests/fixtures/data'", "usage.config.path"),
    ("attestations = '/tmp/att'", "usage.config.path"),
    ("matrix = 'matrix'", "usage.config.schema"),
    ("extra_rego = 'trust.json'", "usage.config.path"),
    # paths no file system takes, and TOML nested past the parser: were exit 1 internal.unexpected
    ('trust = "a\\u0000b"', "usage.config.path"),
    ('extra_rego = "a\\u0000b"', "usage.config.path"),
    ("trust = '" + "x" * 5000 + "'", "usage.config.path"),
    ("trust = 'loop'", "usage.config.path"),
    ("policies = 'loop/x'", "usage.config.path"),
    ("a = " + "[" * 5000 + "]" * 5000, "usage.config.syntax"),
    ("a = " + "{b=" * 2000 + "1" + "}" * 2000, "usage.config.syntax"),
    # docs globs: an absolute one made pathlib raise NotImplementedError in `check` (exit 1), '..' walked out
    ("docs = ['/etc/*']", "usage.config.path"),
    ("docs = ['../*.md']", "usage.config.path"),
    ("docs = ['**/../../*']", "usage.config.path"),
    ('docs = ["docs/a\\u0000.md"]', "usage.config.path"),
])
def test_bad_configurations_are_typed_usage_errors(tmp_path, text, code):
    root = git_repo(tmp_path)
    (tmp_path / "outside.json").write_text("{}")
    (root / "trust.json").write_text("{}")
    (root / "loop").symlink_to("loop")
    (root / "ckptgate.toml").write_text(text)
    with pytest.raises(cfg.ConfigError) as e:
        cfg.load(root)
    assert e.value.code == code and e.value.exit_code == ExitCode.USAGE


@pytest.mark.parametrize(("text", "key", "holds"), [
    ("attestations = '.'", "attestations", "the whole repository"),
    ("matrix = 'data'\nfixtures = 'data/fx'", "matrix", "fixtures"),
    ("attestations = 'keys'\ntrust = 'keys/trust.json'", "attestations", "trust"),
])
def test_the_store_and_the_matrix_may_not_hold_what_decides(tmp_path, text, key, holds):
    """Changes under them never move the candidate commit, so they hold evidence only."""
    root = git_repo(tmp_path)
    (root / "data" / "fx").mkdir(parents=True)
    (root / "keys").mkdir()
    (root / "keys" / "trust.json").write_text("{}")
    (root / "ckptgate.toml").write_text(text)
    with pytest.raises(cfg.ConfigError) as e:
        cfg.load(root)
    assert (e.value.code, e.value.evidence["key"], e.value.evidence["holds"]) == ("usage.config.path", key, holds)


def test_a_docs_pattern_too_long_to_match_is_a_typed_usage_error(tmp_path):
    """Path.glob raised ENAMETOOLONG on it, and `check` ended as internal.unexpected (exit 1)."""
    root = git_repo(tmp_path)
    (root / "ckptgate.toml").write_text("docs = ['" + "a" * 300 + "/*.md']")
    with pytest.raises(cfg.ConfigError) as e:
        cfg.load(root).doc_files()
    assert e.value.code == "usage.config.path" and "File name too long" in e.value.message


def test_pyproject_table_must_be_a_table(tmp_path):
    root = git_repo(tmp_path)
    (root / "pyproject.toml").write_text('[tool]\nckptgate = "x"\n')
    with pytest.raises(cfg.ConfigError) as e:
        cfg.load(root)
    assert e.value.code == "usage.config.schema"


def test_extra_rego_defines_rules_only_in_the_consumer_namespace(tmp_path):
    root = git_repo(tmp_path)
    (root / "policy").mkdir()
    (root / "ckptgate.toml").write_text('extra_rego = "policy"\n')
    (root / "policy" / "gates.rego").write_text("package ckptgate_consumer\n\nok := true\n")
    (root / "policy" / "gates_test.rego").write_text(
        "package ckptgate_consumer.gates_test\n\ntest_ok if data.ckptgate_consumer.ok\n")
    assert cfg.load(root).extra_rego == root / "policy"
    assert set(extra_rego_overlays(root / "policy")) == {"extra/gates.rego"}  # tests stay out of the bundle
    # the bracket spelling is the one the text check of 83cd9f8 let through (the rest: tests/decide/test_extra_rego.py)
    for pkg in ("ckptgate.intake", 'ckptgate["intake"]', "ckptgate", "system.authz", "acme.gates"):
        (root / "policy" / "bad.rego").write_text(f"# widen it\npackage {pkg}\n\nallow := true\n")
        with pytest.raises(cfg.ConfigError) as e:
            cfg.load(root)
        assert e.value.code == "usage.config.extra_rego"
        assert e.value.evidence["file"] == str(root / "policy" / "bad.rego")


def test_init_writes_commented_defaults_that_validate_and_never_overwrites(tmp_path):
    root = git_repo(tmp_path)
    sub = root / "sub"
    sub.mkdir()
    made = ckptgate(sub, "init", "--json")
    assert made.returncode == 0, made.stderr
    doc = json.loads(made.stdout)
    assert doc["config"] == str(root / "ckptgate.toml") and doc["created"] is True
    text = (root / "ckptgate.toml").read_text()
    assert text == INIT_TEMPLATE and "# trust =" in text
    again = ckptgate(sub, "init", "--json")
    assert again.returncode == ExitCode.USAGE
    assert json.loads(again.stdout)["error"]["code"] == "usage.config.exists"
    assert (root / "ckptgate.toml").read_text() == text


def test_init_outside_a_git_work_tree_refuses_and_writes_nothing(tmp_path):
    """Its help says "at the top of the current git work tree": with none, it says so, exit 2."""
    bare = tmp_path / "not-a-repo"
    bare.mkdir()
    for args in (("init", "--json"), ("init",)):
        out = ckptgate(bare, *args)
        assert out.returncode == ExitCode.USAGE, out.stdout + out.stderr
        assert "Traceback" not in out.stderr
        assert not (bare / "ckptgate.toml").exists() and list(bare.iterdir()) == []
    err = json.loads(ckptgate(bare, "init", "--json").stdout)["error"]
    assert err["code"] == "usage.init.no_work_tree" and err["evidence"]["directory"] == str(bare)
    assert str(bare) in err["message"] and "`git init`" in err["advice"]


def test_init_refuses_where_pyproject_already_configures_ckptgate(tmp_path):
    root = git_repo(tmp_path)
    (root / "pyproject.toml").write_text("[tool.ckptgate]\n")
    out = ckptgate(root, "init", "--json")
    assert out.returncode == ExitCode.USAGE and json.loads(out.stdout)["error"]["code"] == "usage.config.exists"
    assert not (root / "ckptgate.toml").exists()


def test_a_bad_configuration_stops_every_engine_command_with_its_code(tmp_path):
    root = git_repo(tmp_path)
    (root / "ckptgate.toml").write_text("nope = 1\n")
    for args in (("decide", str(root), "--json"), ("check", "--json")):
        out = ckptgate(root, *args)
        assert out.returncode == ExitCode.USAGE, out.stdout + out.stderr
        assert json.loads(out.stdout)["error"]["code"] == "usage.config.unknown_key"


def test_check_plan_for_a_consumer_skips_what_is_not_configured(tmp_path):
    root = git_repo(tmp_path)
    (root / "ckptgate.toml").write_text(INIT_TEMPLATE)
    reasons = plan(cfg.load(root))
    assert set(reasons) == set(CHECK_NAMES) - {"claims"}
    assert "no matrix" in reasons["matrix_drift"] and "no extra_rego" in reasons["policy_tests"]
    (root / "policy").mkdir()
    (root / "policy" / "a.rego").write_text("package ckptgate_consumer\n")
    (root / "ckptgate.toml").write_text('extra_rego = "policy"\n')
    assert set(plan(cfg.load(root))) == {"matrix_drift", "gate_drift", "evidence"}
    assert plan(None) == {} and plan(None, ["claims"]) == {"claims": "--skip claims"}


def test_ckptgate_own_repository_is_configured_and_enables_every_check():
    own = cfg.load(REPO)
    assert own is not None and own.source == REPO / "ckptgate.toml"
    assert own.policies == REPO / "policies" and own.matrix == REPO / "matrix"
    assert plan(own) == {}
    assert REPO / "README.md" in own.doc_files() and REPO / "docs" / "user-guide.md" in own.doc_files()


def test_check_runs_the_extra_rego_tests_with_the_bundled_policies_loaded(tmp_path):
    from ckptgate.decide.bundle import find_opa
    from ckptgate.errors import EngineUnavailable

    try:
        find_opa()
    except EngineUnavailable:
        pytest.skip("no OPA binary here")
    root = tmp_path / "repo"
    (root / "policy").mkdir(parents=True)
    (root / "policy" / "gates.rego").write_text("package ckptgate_consumer.gates\n\nimport rego.v1\n\n"
                                                "ok if input.x == 1\n\nbundled if data.ckptgate.config.trust\n")
    (root / "policy" / "gates_test.rego").write_text(
        "package ckptgate_consumer.gates_test\n\nimport rego.v1\n\nimport data.ckptgate_consumer.gates\n\n"
        "test_sees_bundled_data if gates.bundled\n\ntest_bad if gates.ok with input as {\"x\": 2}\n")
    (root / "ckptgate.toml").write_text('extra_rego = "policy"\ndocs = []\n')
    for args in (("init", "-q"), ("add", "-A"), ("-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "x")):
        subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)
    out = ckptgate(root, "check", "--json", "--skip", "regal_lint")
    assert out.returncode == ExitCode.DENIED, out.stdout + out.stderr
    doc = json.loads(out.stdout)
    checks = {c["name"]: c for c in doc["checks"]}
    assert set(checks) == {"policy_tests", "opa_fmt", "claims"} and checks["claims"]["passed"]
    [failed] = checks["policy_tests"]["findings"]  # test_sees_bundled_data passed: the bundled policies are there
    assert failed["message"].endswith("ckptgate_consumer.gates_test.test_bad failed") and failed["file"] == "policy/gates_test.rego"
    assert doc["skip_reasons"] == {"regal_lint": "--skip regal_lint",
                                   "matrix_drift": plan(cfg.load(root))["matrix_drift"],
                                   "gate_drift": plan(cfg.load(root))["gate_drift"],
                                   "evidence": plan(cfg.load(root))["evidence"]}


def test_attest_add_stores_into_the_configured_attestations(tmp_path):
    root = git_repo(tmp_path)
    [envelope] = sorted((REPO / "attestations").glob("sha256-*/*.dsse.json"))[:1]
    (root / "ckptgate.toml").write_text('attestations = "evidence/att"\n')
    shutil.copy(envelope, root / "a.dsse.json")
    out = ckptgate(root, "attest", "add", "a.dsse.json", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    [stored] = json.loads(out.stdout)["stored"]
    assert Path(stored).resolve().is_relative_to((root / "evidence" / "att").resolve())
    assert (root / "evidence" / "att" / "index.json").is_file() and not (root / "attestations").exists()


def test_config_error_is_the_errors_module_one_and_a_usage_error():
    """ConfigError lives in ckptgate.errors (policydata raises it without importing config); the
    name ckptgate.config.ConfigError stays, and its exit code is the usage one."""
    from ckptgate import errors, policydata

    assert cfg.ConfigError is errors.ConfigError is policydata.ConfigError
    assert issubclass(cfg.ConfigError, errors.UsageError)
    assert cfg.ConfigError("usage.config.schema", "x").exit_code == ExitCode.USAGE
