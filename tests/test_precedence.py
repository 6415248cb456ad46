"""Configuration provenance (issue #30): what a change under review can edit may restrict the gate,
never widen it; discovery stops where git's does; another user's files configure nothing; ``--base``
reads the configuration from git's objects; every input is named in the decision."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ckptgate import config as cfg
from ckptgate.config.owners import _private_group
from ckptgate import policydata
from ckptgate.errors import ExitCode
from ckptgate.verify import QUALIFICATION_PREDICATE_TYPE, trust_entry
from tests.pipeline_helpers import FIXTURES, demo_attested

REPO = Path(__file__).resolve().parent.parent
NOBODY = 65534


def run(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("CKPTGATE_")}
    return subprocess.run([sys.executable, "-m", "ckptgate", *args], cwd=cwd, env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=240, check=False)


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args], cwd=cwd,
                   check=True, capture_output=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("ckpt") / "model"
    shutil.copytree(FIXTURES / "hf_sharded" / "checkpoint", src)
    return src


# ------------------------------------------------------------------------------------- discovery
def test_discovery_outside_git_stops_at_home(tmp_path, monkeypatch):
    """With no git work tree above the cwd, a ckptgate.toml above the user's home is never read
    (issue #30, case 3: a file planted in a shared directory above the job)."""
    (tmp_path / "ckptgate.toml").write_text("docs = []\n")
    home = tmp_path / "home"
    job = home / "job"
    job.mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    assert cfg.discover(job) is None
    (home / "ckptgate.toml").write_text("docs = []\n")
    assert cfg.discover(job) == home / "ckptgate.toml"


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_a_configuration_another_user_owns_is_refused(tmp_path):
    root = tmp_path / "repo"
    (root / ".git").mkdir(parents=True)
    (root / "ckptgate.toml").write_text("docs = []\n")
    os.chown(root / "ckptgate.toml", NOBODY, NOBODY)
    out = run(root, "decide", str(FIXTURES / "hf_sharded" / "checkpoint"), "--json")
    assert out.returncode == ExitCode.USAGE and json.loads(out.stdout)["error"]["code"] == "usage.config.unsafe_owner"
    out = run(root, "decide", str(FIXTURES / "hf_sharded" / "checkpoint"), "--json",
              env={cfg.SAFE_OWNERS_ENV: str(NOBODY)})
    assert json.loads(out.stdout).get("error", {}).get("code") != "usage.config.unsafe_owner", out.stdout


def test_a_configuration_writable_by_others_is_refused(tmp_path):
    root = tmp_path / "repo"
    (root / ".git").mkdir(parents=True)
    (root / "ckptgate.toml").write_text("docs = []\n")
    (root / "ckptgate.toml").chmod(0o646)
    with pytest.raises(cfg.ConfigError) as e:
        cfg.check_owner(root / "ckptgate.toml", "the configuration file")
    assert e.value.code == "usage.config.unsafe_mode"


@pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")
def test_group_write_counts_only_for_a_group_others_are_in(tmp_path):
    """A group-writable file is refused when its group is shared; in the user's own private group
    (Debian's and Ubuntu's umask 002) the write bit lets no one else in."""
    import grp

    f = tmp_path / "ckptgate.toml"
    f.write_text("docs = []\n")
    f.chmod(0o664)
    shared = next((g for g in grp.getgrall() if g.gr_mem), None)  # a group with members, e.g. a login group
    os.chown(f, 0, shared.gr_gid if shared is not None else NOBODY)
    with pytest.raises(cfg.ConfigError) as e:
        cfg.check_owner(f, "the configuration file")
    assert e.value.code == "usage.config.unsafe_mode"
    private = max(g.gr_gid for g in grp.getgrall()) + 1000  # a group no user is in or has as primary
    assert _private_group(private, 0) is False  # unknown to the system: not known to be private
    assert _private_group(0, 0) is all(p.pw_uid == 0 for p in __import__("pwd").getpwall() if p.pw_gid == 0)


def test_isolated_and_the_environment_use_no_configuration(tmp_path, checkpoint):
    root = tmp_path / "repo"
    (root / ".git").mkdir(parents=True)
    (root / "ckptgate.toml").write_text('policies = "nowhere"\n')  # invalid: refused whenever it is read
    out = run(root, "decide", str(checkpoint), "--json")
    assert json.loads(out.stdout)["error"]["code"] == "usage.config.path"
    for args, env in ((("--isolated",), None), ((), {"CKPTGATE_NO_CONFIG": "1"})):
        out = run(root, "decide", str(checkpoint), "--json", *args, env=env)
        assert "error" not in json.loads(out.stdout), out.stdout
        assert [i["role"] for i in json.loads(out.stdout)["decision"]["inputs"]] == ["policy_tree", "trust"]


def test_a_discovered_policy_tree_is_refused(tmp_path, checkpoint):
    """issue #30, case 2: `policies = DIR` in a repository's own ckptgate.toml replaces no Rego."""
    root = tmp_path / "repo"
    (root / ".git").mkdir(parents=True)
    shutil.copytree(REPO / "policies", root / "pol", ignore=shutil.ignore_patterns("*_test.rego"))
    rego = root / "pol" / "ckptgate" / "intake" / "intake.rego"
    rego.write_text(rego.read_text().replace("_inspection_clean if input.inspection.clean == true",
                                             "_inspection_clean if true"))
    (root / "ckptgate.toml").write_text('policies = "pol"\ndocs = []\n')
    out = run(root, "decide", str(checkpoint), "--json", "--trust", str(REPO / "policies" / policydata.TRUST_IN_BUNDLE))
    assert out.returncode == ExitCode.USAGE, out.stdout
    assert json.loads(out.stdout)["error"]["code"] == "usage.config.widens"
    # an explicit --policies is hermetic: the configuration's tree is not used
    out = run(root, "decide", str(checkpoint), "--json", "--policies", str(REPO / "policies"))
    assert "error" not in json.loads(out.stdout), out.stdout


# ------------------------------------------------------------------------------------- --base
def test_the_pull_request_cannot_widen_its_own_check(tmp_path, checkpoint):
    """A consumer repository plays the pull request: it edits its trust data and its overlay to
    admit its own unsigned... its own key.  `decide --base` and `intake --base` read the base's
    configuration and refuse; `check --base` names each widening."""
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    att = demo_attested(checkpoint, tmp_path)
    (root / "ckptgate-data.json").write_text(json.dumps({"freshness": {"max_age_seconds": 3600}}))
    (root / "ckptgate.toml").write_text('policy_data = "ckptgate-data.json"\ndocs = ["README.md"]\n')
    (root / "README.md").write_text("# Our models\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "base")
    # the pull request: its own key trusted, a longer window, and an over-claim the lint would refuse,
    # hidden by reading no docs
    (root / "ckptgate.toml").write_text('policy_data = "ckptgate-data.json"\ndocs = []\n')
    (root / "README.md").write_text("# Our models\n\nThe gate proves that every checkpoint it publishes is safe to load.\n")
    entry = trust_entry(att.public_pem, signer_id="pr-key", predicate_types=[QUALIFICATION_PREDICATE_TYPE])
    (root / "ckptgate-data.json").write_text(json.dumps({"signers": [entry], "freshness": {"max_age_seconds": 99999}}))
    out = run(root, "decide", str(checkpoint), "--attestation", str(att.attestation), "--json", "--base", "main")
    doc = json.loads(out.stdout)
    assert out.returncode == ExitCode.VERIFICATION_FAILED and not doc["decision"]["allow"], out.stdout
    inputs = {i["role"]: i for i in doc["decision"]["inputs"]}
    assert inputs["configuration"]["origin"] == "base" and inputs["configuration"]["path"] == "main:ckptgate.toml"
    assert inputs["overlay"]["path"] == "main:ckptgate-data.json"
    dst = tmp_path / "out"
    out = run(root, "intake", str(checkpoint), "--out", str(dst), "--attestation", str(att.attestation), "--json",
              "--base", "main")
    assert out.returncode == ExitCode.VERIFICATION_FAILED and not dst.exists(), out.stdout
    out = run(root, "check", "--base", "main", "--json", "--skip", "policy_tests", "--skip", "opa_fmt",
              "--skip", "regal_lint")
    report = json.loads(out.stdout)
    assert out.returncode == 3, out.stdout
    found = {f["code"] for r in report["checks"] if r["name"] == "widening" for f in r["findings"]}
    assert found == {"widening.signer_added", "widening.freshness_lengthened"}, report
    claims = [r for r in report["checks"] if r["name"] == "claims"]
    assert claims and not claims[0]["passed"], report  # the base's docs setting still reads README.md
    # without --base, the change's own settings would pass the over-claim
    out = run(root, "check", "--json", "--skip", "policy_tests", "--skip", "opa_fmt", "--skip", "regal_lint",
              "--skip", "evidence", "--skip", "matrix_drift")
    assert [r for r in json.loads(out.stdout)["checks"] if r["name"] == "claims"][0]["passed"], out.stdout
    # without --base, the work tree's own overlay is refused outright: it widens
    out = run(root, "decide", str(checkpoint), "--attestation", str(att.attestation), "--json")
    assert json.loads(out.stdout)["error"]["code"] == "usage.config.widens", out.stdout


def test_only_the_base_configuration_lowers_widening_to_a_warning(tmp_path):
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    (root / "ckptgate.toml").write_text('docs = []\nwidening = "warning"\n')
    (root / "trust.json").write_text((REPO / "policies" / policydata.TRUST_IN_BUNDLE).read_text())
    git(root, "add", "-A")
    git(root, "commit", "-qm", "base")
    trust = json.loads((root / "trust.json").read_text())
    trust["signers"].append({**trust["signers"][0], "id": "pr-added"})
    (root / "trust.json").write_text(json.dumps(trust))
    (root / "ckptgate.toml").write_text('docs = []\ntrust = "trust.json"\n')
    args = ("check", "--base", "main", "--json", "--skip", "policy_tests", "--skip", "opa_fmt", "--skip",
            "regal_lint", "--skip", "claims")
    out = run(root, *args)
    report = json.loads(out.stdout)
    findings = [f for r in report["checks"] if r["name"] == "widening" for f in r["findings"]]
    assert out.returncode == 0 and {f["severity"] for f in findings} == {"warning"}, report
    (root / "ckptgate.toml").write_text('docs = []\ntrust = "trust.json"\nwidening = "warning"\n')
    git(root, "commit", "-qam", "pr lowers it")
    (root / "ckptgate.toml").write_text('docs = []\ntrust = "trust.json"\n')
    git(root, "commit", "-qam", "base says error")
    git(root, "checkout", "-q", "-b", "pr")
    (root / "ckptgate.toml").write_text('docs = []\ntrust = "trust.json"\nwidening = "warning"\n')
    trust["signers"].append({**trust["signers"][0], "id": "pr-added-2"})
    (root / "trust.json").write_text(json.dumps(trust))
    out = run(root, *args)
    assert out.returncode == 3, out.stdout  # the change's own "warning" does not count


def test_an_unknown_base_revision_is_a_usage_error(tmp_path, checkpoint):
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    out = run(root, "decide", str(checkpoint), "--json", "--base", "no-such-branch")
    assert out.returncode == ExitCode.USAGE and json.loads(out.stdout)["error"]["code"] == "usage.base.git"


# ------------------------------------------------------------------ review of issue #30: what was missed
def test_check_base_names_a_policy_tree_the_pull_request_brings(tmp_path):
    """A pull request that adds `policies = DIR` (a copy of the bundled tree that passes every
    inspection, and whose data no longer lists auto_map as code-bearing) widens the gate for every
    later `intake --base`: `check --base` must name it, not report that nothing widens."""
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    (root / "ckptgate.toml").write_text("docs = []\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "base")
    shutil.copytree(REPO / "policies", root / "pol", ignore=shutil.ignore_patterns("*_test.rego"))
    rego = root / "pol" / "ckptgate" / "intake" / "intake.rego"
    rego.write_text(rego.read_text().replace("_inspection_clean if input.inspection.clean == true",
                                             "_inspection_clean if true"))
    data = root / "pol" / policydata.INTAKE_IN_BUNDLE
    doc = json.loads(data.read_text())
    doc["code_bearing_findings"]["codes"] = []
    data.write_text(json.dumps(doc))
    (root / "ckptgate.toml").write_text('docs = []\npolicies = "pol"\n')
    out = run(root, "check", "--base", "main", "--json", "--skip", "policy_tests", "--skip", "opa_fmt",
              "--skip", "regal_lint", "--skip", "claims")
    report = json.loads(out.stdout)
    found = {f["code"] for r in report["checks"] if r["name"] == "widening" for f in r["findings"]}
    assert out.returncode == 3, out.stdout
    assert {"widening.policy_tree_changed", "widening.policy_data_changed"} <= found, report


def test_a_discovered_overlay_cannot_lengthen_freshness_with_an_exponent(tmp_path, checkpoint):
    """`1e12` is an integer to JSON Schema but a float to Python: the overlay passes its schema and the
    comparison must still see that the window is lengthened."""
    root = tmp_path / "repo"
    (root / ".git").mkdir(parents=True)
    (root / "ckptgate-data.json").write_text('{"freshness": {"max_age_seconds": 1e12}}')
    (root / "ckptgate.toml").write_text('policy_data = "ckptgate-data.json"\ndocs = []\n')
    out = run(root, "decide", str(checkpoint), "--json")
    assert out.returncode == ExitCode.USAGE, out.stdout
    assert json.loads(out.stdout)["error"]["code"] == "usage.config.widens", out.stdout


def test_a_discovered_trust_file_is_compared_with_the_explicit_policy_tree(tmp_path, checkpoint):
    """Under an explicit --policies, a discovered trust file may restrict that tree's trust data,
    never add a signer the tree does not trust (even one the bundled trust data holds)."""
    root = tmp_path / "repo"
    (root / ".git").mkdir(parents=True)
    tree = tmp_path / "org-policies"
    shutil.copytree(REPO / "policies", tree, ignore=shutil.ignore_patterns("*_test.rego"))
    rego = tree / "ckptgate" / "intake" / "intake.rego"
    rego.write_text(rego.read_text() + "\n# the organisation's copy\n")
    bundled_trust = (REPO / "policies" / policydata.TRUST_IN_BUNDLE).read_text()
    (root / "trust.json").write_text(bundled_trust)
    (root / "ckptgate.toml").write_text('trust = "trust.json"\ndocs = []\n')
    out = run(root, "decide", str(checkpoint), "--json", "--policies", str(tree))
    assert "error" not in json.loads(out.stdout), out.stdout  # the same trust as the tree's: no widening
    (tree / policydata.TRUST_IN_BUNDLE).write_text('{"signers": []}')
    out = run(root, "decide", str(checkpoint), "--json", "--policies", str(tree))
    assert json.loads(out.stdout)["error"]["code"] == "usage.config.widens", out.stdout


def test_check_base_names_a_policies_directory_that_replaces_the_configuration(tmp_path):
    """A pull request deletes ckptgate.toml and adds policies/ with a claims policy that finds
    nothing: with no configuration, `check` judges with the work tree's own policies/, so the
    widening check must compare that tree with the base's, not the bundled one with itself."""
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    (root / "ckptgate.toml").write_text('docs = ["README.md"]\n')
    (root / "README.md").write_text("# Our models\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "base")
    git(root, "rm", "-q", "ckptgate.toml")
    claim = "The gate proves that every checkpoint it publishes is safe to load."
    (root / "README.md").write_text(f"# Our models\n\n{claim}\n")
    shutil.copytree(REPO / "policies", root / "policies", ignore=shutil.ignore_patterns("*_test.rego"))
    claims = root / "policies" / "ckptgate" / "claims" / "claims.rego"
    claims.write_text(claims.read_text().replace("violations contains v if {", "violations contains v if {\n\tfalse"))
    out = run(root, "check", "--base", "main", "--json", "--skip", "policy_tests", "--skip", "opa_fmt",
              "--skip", "regal_lint")
    report = json.loads(out.stdout)
    assert out.returncode == 3, out.stdout
    found = {(f["code"], f["file"]) for r in report["checks"] if r["name"] == "widening" for f in r["findings"]}
    assert ("widening.policy_tree_changed", "policies/ckptgate/claims/claims.rego") in found, report


def test_an_explicit_config_beats_the_environment(tmp_path, checkpoint):
    """`--config PATH` names the configuration even where CKPTGATE_NO_CONFIG=1 is set: an explicit
    option beats an environment variable, and a restriction the named configuration adds (here an
    invalid one, refused whenever it is read) is never dropped silently."""
    conf = tmp_path / "conf" / "ckptgate.toml"
    conf.parent.mkdir()
    conf.write_text('policies = "nowhere"\n')
    out = run(tmp_path, "decide", str(checkpoint), "--json", "--config", str(conf), env={"CKPTGATE_NO_CONFIG": "1"})
    assert json.loads(out.stdout)["error"]["code"] == "usage.config.path", out.stdout


def test_a_base_link_out_of_the_tree_is_a_typed_error(tmp_path, checkpoint):
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    (root / "trust.json").symlink_to("/etc/hostname")
    (root / "ckptgate.toml").write_text('trust = "trust.json"\ndocs = []\n')
    git(root, "add", "-A")
    git(root, "commit", "-qm", "base")
    out = run(root, "decide", str(checkpoint), "--json", "--base", "main")
    assert out.returncode == ExitCode.USAGE, out.stdout
    assert json.loads(out.stdout)["error"]["code"] == "usage.base.link", out.stdout


def test_config_with_base_is_refused_rather_than_dropped(tmp_path, checkpoint):
    """`--config` with `--base` on a deciding command: the explicit configuration was dropped in
    silence for the base's, with every restriction it adds."""
    root = tmp_path / "repo"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    (root / "README.md").write_text("# x\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "base")
    conf = tmp_path / "ci" / "ckptgate.toml"
    conf.parent.mkdir()
    conf.write_text("docs = []\n")
    out = run(root, "decide", str(checkpoint), "--json", "--config", str(conf), "--base", "main")
    assert out.returncode == ExitCode.USAGE, out.stdout
    assert json.loads(out.stdout)["error"]["code"] == "usage.conflicting_options", out.stdout


def test_a_policy_tree_named_by_the_environment_is_named_so(tmp_path, checkpoint):
    """CKPTGATE_POLICIES names the policy tree and its trust data: the decision says the
    environment named them, not that they are the bundled ones."""
    tree = tmp_path / "pol"
    shutil.copytree(REPO / "policies", tree, ignore=shutil.ignore_patterns("*_test.rego"))
    out = run(tmp_path, "decide", str(checkpoint), "--json", "--isolated", env={"CKPTGATE_POLICIES": str(tree)})
    inputs = {i["role"]: i for i in json.loads(out.stdout)["decision"]["inputs"]}
    assert inputs["policy_tree"]["origin"] == "environment", out.stdout
    assert inputs["trust"]["origin"] == "environment", out.stdout
    out = run(tmp_path, "decide", str(checkpoint), "--json", "--isolated")
    assert {i["role"]: i["origin"] for i in json.loads(out.stdout)["decision"]["inputs"]} == {
        "policy_tree": "bundled", "trust": "bundled"}


def test_a_discovered_trust_file_swapped_after_the_widening_check_is_not_read_again(tmp_path, monkeypatch):
    """The widening check read the work tree's trust file, and the verifier read it a second time:
    a signer added between the two reads was trusted.  Now both read one copy of the bytes."""
    from ckptgate import precedence
    from ckptgate._resources import default_policy_dir
    from ckptgate.decide.options import load_trust

    git(tmp_path, "init", "-q")
    bundled = (default_policy_dir() / policydata.TRUST_IN_BUNDLE).read_bytes()
    (tmp_path / "trust.json").write_bytes(bundled)
    (tmp_path / "ckptgate.toml").write_text('trust = "trust.json"\npolicies = "policies"\n')
    shutil.copytree(default_policy_dir(), tmp_path / "policies")  # the bundled tree's bytes: no widening
    checked = precedence._refuse_widening

    def check_then_swap(*args, **kwargs):
        checked(*args, **kwargs)
        doc = json.loads(bundled)
        doc["signers"].append({**doc["signers"][0], "id": "added-after-the-check"})
        (tmp_path / "trust.json").write_text(json.dumps(doc))
        (tmp_path / "policies" / "ckptgate" / "intake" / "swapped.rego").write_text("package ckptgate.intake\n")

    monkeypatch.delenv("CKPTGATE_NO_CONFIG", raising=False)
    monkeypatch.setattr(precedence, "_refuse_widening", check_then_swap)
    resolved = precedence.resolve(precedence.Named(start=tmp_path))
    assert [s["id"] for s in json.loads(load_trust(resolved.engine).raw)["signers"]] == [
        s["id"] for s in json.loads(bundled)["signers"]
    ]
    assert resolved.engine.policy_dir == default_policy_dir()  # the tree checked is the tree loaded
    assert resolved.engine.provenance["trust"] == ("discovered", str(tmp_path / "trust.json"))


def test_a_signed_bundle_is_read_once_and_named_by_the_path_given(tmp_path, monkeypatch):
    """The bundle's digest (its decision input), its trust data (Python's verifier) and the bundle
    OPA loads were three reads of one path: another bundle signed with the same key (an older one)
    put there between them decided while the decision named the first.  Now one copy serves all."""
    from ckptgate import precedence
    from ckptgate.decide.options import EngineOptions, decision_inputs

    bundle, key = tmp_path / "policy.tar.gz", tmp_path / "k.pub"
    bundle.write_bytes(b"first bundle")
    key.write_bytes(b"key")
    monkeypatch.setenv("CKPTGATE_NO_CONFIG", "1")
    resolved = precedence.resolve(precedence.Named(engine=EngineOptions(policy_bundle=bundle, policy_key=key)))
    bundle.write_bytes(b"second bundle")  # replaced after the run read it
    assert resolved.engine.policy_bundle != bundle and resolved.engine.policy_bundle.read_bytes() == b"first bundle"
    (named,) = [i for i in decision_inputs(resolved.engine, None, {}) if i.role == "policy_bundle"]
    assert (named.path, named.origin) == (str(bundle), "signed")
    assert named.sha256 == "sha256:" + hashlib.sha256(b"first bundle").hexdigest()


def test_a_malformed_discovered_trust_file_is_a_typed_error_naming_it(tmp_path, monkeypatch):
    """{"signers": 3} in a discovered trust file reached the widening check, which iterated it:
    internal.unexpected (exit 1).  It is the trust data's own typed error, naming the configured path."""
    from ckptgate import precedence
    from ckptgate.verify.trust import TrustDataError

    git(tmp_path, "init", "-q")
    (tmp_path / "trust.json").write_text('{"signers": 3}')
    (tmp_path / "ckptgate.toml").write_text('trust = "trust.json"\n')
    monkeypatch.delenv("CKPTGATE_NO_CONFIG", raising=False)
    with pytest.raises(TrustDataError) as e:
        precedence.resolve(precedence.Named(start=tmp_path))
    assert e.value.code == "verify.trust.shape" and str(tmp_path / "trust.json") in e.value.message


def test_a_configuration_file_that_cannot_be_copied_whole_is_refused_not_handed_on(tmp_path: Path) -> None:
    """The private copy fell back to the work-tree path for a file over the limit (or a FIFO): each later
    reader then read that path again, so a file swapped after the widening check still decided."""
    import os

    from ckptgate.errors import ConfigError
    from ckptgate.precedence import _read_once

    big = tmp_path / "trust.json"
    big.write_bytes(b" " * 65)
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for path in (big, fifo, tmp_path / "absent.json"):
        with pytest.raises(ConfigError) as e:
            _read_once(path, limit=64, what="the trust data")
        assert e.value.code == "usage.config.path" and str(path) in e.value.message


def test_a_private_copy_a_killed_run_left_is_swept_by_the_next_run(tmp_path: Path) -> None:
    """The private copies (a configuration's trust data, a signed bundle, ``--base``'s files) were
    temporary directories in /tmp: a SIGKILL-ed run left them there for good.  They are work
    directories now, held by the run's lock, and the next run's sweep removes a dead run's."""
    import os

    from ckptgate import workdirs

    git(tmp_path, "init", "-q")
    (tmp_path / "trust.json").write_bytes((REPO / "policies" / policydata.TRUST_IN_BUNDLE).read_bytes())
    (tmp_path / "ckptgate.toml").write_text('trust = "trust.json"\n')
    script = (
        "import os, signal, sys\n"
        "from pathlib import Path\n"
        "from ckptgate import precedence\n"
        "r = precedence.resolve(precedence.Named(start=Path(sys.argv[1])))\n"
        "print(r.engine.trust_file, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTGATE_")}
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    assert out.returncode == -9, out.stderr
    copy = Path(out.stdout.strip())
    assert copy.read_bytes() == (tmp_path / "trust.json").read_bytes()  # left behind by the kill
    assert copy.parent.parent.parent == workdirs.runtime_dir()  # in this run's private runtime directory
    workdirs.sweep()  # what the next run does first
    assert not copy.exists() and not copy.parent.parent.exists()


def test_a_lease_directory_removed_under_a_long_lived_process_is_renewed(tmp_path: Path, monkeypatch) -> None:
    """Review (session 49): once the runtime directory was cleaned under a long-lived process (logind at the
    user's last logout), every later resolve() raised a bare FileNotFoundError.  A new lease is taken."""
    import shutil

    from ckptgate import precedence

    monkeypatch.setattr(precedence, "_lease", None)
    git(tmp_path, "init", "-q")
    (tmp_path / "trust.json").write_bytes((REPO / "policies" / policydata.TRUST_IN_BUNDLE).read_bytes())
    (tmp_path / "ckptgate.toml").write_text('trust = "trust.json"\n')
    monkeypatch.delenv("CKPTGATE_NO_CONFIG", raising=False)
    first = precedence.resolve(precedence.Named(start=tmp_path)).engine.trust_file
    old = precedence._lease
    assert old is not None
    shutil.rmtree(old.path)
    second = precedence.resolve(precedence.Named(start=tmp_path)).engine.trust_file
    assert precedence._lease is not old and second.read_bytes() == (tmp_path / "trust.json").read_bytes()
    assert not first.exists()
    precedence._lease.release()


_FORKED = """
import json, os, sys
from pathlib import Path
from ckptgate import precedence, workdirs

mode, src = sys.argv[1], Path(sys.argv[2])
before = precedence._read_once(src, what="trust data")  # the parent's private copy, made before the fork
go_r, go_w = os.pipe()  # EOF on go_r once the process that exits first is gone (atexit run)
pid = os.fork()
me = "child" if pid == 0 else "parent"
first = mode.startswith(me)
mine = precedence._read_once(src, what="trust data")  # a copy made after the fork
if first:
    os.close(go_r)
    workdirs.sweep()  # a sweep while the other is alive
    print(json.dumps([me, before.exists(), mine.exists()]), flush=True)
    if mode.endswith("os._exit"):
        os._exit(0)  # as a multiprocessing worker leaves: no atexit
    sys.exit(0)
os.close(go_w)
os.read(go_r, 1)
if me == "parent":
    os.waitpid(pid, 0)
workdirs.sweep()
print(json.dumps([me, before.exists(), mine.exists()]), flush=True)
"""


@pytest.mark.parametrize("mode", ["child-first", "parent-first", "child-first-os._exit"])
def test_a_forked_process_and_its_parent_keep_their_private_copies_until_both_are_gone(
    tmp_path: Path, mode: str
) -> None:
    """A process that forks after making private copies (DataLoader workers, launchers): the parent's exit
    removed the work directory the child was still using (the copies it inherited and those it made there),
    and the child's never released what it made.  Now the lease is shared across the fork: whichever exits
    first, and whatever either's sweep does meanwhile, the other keeps every copy; once both are gone,
    nothing is left (a child that leaves by ``os._exit`` drops its share all the same)."""
    runtime, state = tmp_path / "run", tmp_path / "state"
    runtime.mkdir(mode=0o700)
    state.mkdir(mode=0o700)
    (tmp_path / "trust.json").write_bytes((REPO / "policies" / policydata.TRUST_IN_BUNDLE).read_bytes())
    (tmp_path / "forked.py").write_text(_FORKED)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTGATE_")}
    env.update(XDG_RUNTIME_DIR=str(runtime), XDG_STATE_HOME=str(state))
    out = subprocess.run([sys.executable, str(tmp_path / "forked.py"), mode, str(tmp_path / "trust.json")],
                         env=env, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    seen = [json.loads(line) for line in out.stdout.splitlines()]
    first = mode.split("-")[0]
    assert [who for who, *_ in seen] == [first, "parent" if first == "child" else "child"]
    assert all(kept == [True, True] for _, *kept in seen), seen  # every copy, in each, until it exits
    assert [p.name for p in (runtime / "ckptgate").iterdir()] == []  # nothing left once both are gone
    assert [p.name for p in (state / "ckptgate" / "live").iterdir()] == []
