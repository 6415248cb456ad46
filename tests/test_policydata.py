"""The configuration's policy-data overlay: validated strictly, merged under its rule, and read by
every command that decides (a changed freshness window, an added signer or finding exception
changes a real decision)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ckptgate import config as cfg
from ckptgate import policydata
from ckptgate.errors import ExitCode
from ckptgate.verify import QUALIFICATION_PREDICATE_TYPE, trust_entry
from tests.pipeline_helpers import FIXTURES, demo_attested

REPO = Path(__file__).resolve().parent.parent
POLICIES = REPO / "policies"
INTAKE = json.loads((POLICIES / policydata.INTAKE_IN_BUNDLE).read_text())
GATES = json.loads((POLICIES / policydata.GATES_IN_BUNDLE).read_text())
EXCEPTION = {"id": "acme-notes", "formats": ["hf-sharded-safetensors"], "code": "classify.extension_mismatch",
             "paths": ["notes.json"], "why": "our exporter misnames its notes; ckptgate never loads them"}
CODE_EXCEPTION = {"id": "acme-helper", "formats": ["hf-sharded-safetensors"], "code": "classify.code",
                  "paths": ["helper.py"], "why": "our exporter adds helper.py; ckptgate never runs it"}


def consumer(tmp_path: Path, overlay: object) -> Path:
    root = tmp_path / "repo"
    (root / ".git").mkdir(parents=True)
    (root / "ckptgate-data.json").write_text(overlay if isinstance(overlay, str) else json.dumps(overlay))
    (root / "ckptgate.toml").write_text('policy_data = "ckptgate-data.json"\ndocs = []\n')
    return root


def decide(cwd: Path, src: Path, attestation: Path, *options: str, explicit: bool = True) -> tuple[int, dict]:
    """``decide`` in ``cwd``; ``explicit``: naming its configuration with ``--config`` (a configuration
    only discovered in the work tree may only restrict the gate)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTGATE_")}
    named = ["--config", str(cwd / "ckptgate.toml")] if explicit else []
    out = subprocess.run([sys.executable, "-m", "ckptgate", "decide", str(src), "--attestation", str(attestation),
                          "--json", *named, *options], cwd=cwd, env=env, capture_output=True, text=True, timeout=180,
                         check=False)
    return out.returncode, json.loads(out.stdout)


def signer(public_pem: bytes) -> dict:
    return trust_entry(public_pem, signer_id="acme-release", predicate_types=[QUALIFICATION_PREDICATE_TYPE])


def codes(doc: dict) -> set[str]:
    return {r["code"] for r in doc["decision"]["reasons"]}


@pytest.mark.parametrize(("overlay", "code"), [
    ("{", "usage.config.policy_data"),
    ("[]", "usage.config.policy_data"),
    ({"rego": "package ckptgate.intake"}, "usage.config.policy_data_unknown_key"),
    ({"refusal": {}}, "usage.config.policy_data_unknown_key"),
    ({"freshness": {"max_age_seconds": 0}}, "usage.config.policy_data"),
    ({"freshness": {"max_clock_skew_seconds": 7200}}, "usage.config.policy_data"),
    ({"freshness": {"max_age": 5}}, "usage.config.policy_data_unknown_key"),
    ({"finding_exceptions": [{**EXCEPTION, "why": "short"}]}, "usage.config.policy_data"),
    ({"finding_exceptions": [{**EXCEPTION, "id": INTAKE["finding_exceptions"][0]["id"]}]},
     "usage.config.policy_data_conflict"),
    ({"gates": {"no-such-adapter": {"versions": {"any": True, "exact": [], "ranges": []}}}},
     "usage.config.policy_data_conflict"),
    ({"gates": {"dcp": {"versions": {"any": "yes"}}}}, "usage.config.policy_data"),
    ({"gates": {"dcp": {"versions": {"any": False, "exact": [], "ranges": []}, "producer": "*"}}},
     "usage.config.policy_data_unknown_key"),
    ({"signers": [{"id": "ci-qualification", "kind": "key"}]}, "usage.config.policy_data"),
    # nested past the parser (was exit 1 RecursionError), and a repeated key (was: the last one won)
    ("[" * 100_000 + "]" * 100_000, "usage.config.policy_data"),
    ('{"freshness": {}, "freshness": {"max_age_seconds": 1}}', "usage.config.policy_data"),
])
def test_a_malformed_overlay_is_a_typed_usage_error(tmp_path, overlay, code):
    root = consumer(tmp_path, overlay)
    with pytest.raises(cfg.ConfigError) as e:
        cfg.load(root)
    assert e.value.code == code and e.value.exit_code == ExitCode.USAGE, e.value.message


def test_a_signer_already_trusted_cannot_be_replaced(tmp_path):
    bundled = json.loads((POLICIES / policydata.TRUST_IN_BUNDLE).read_text())["signers"][0]
    root = consumer(tmp_path, {"signers": [bundled]})
    with pytest.raises(cfg.ConfigError) as e:
        cfg.load(root)
    assert e.value.code == "usage.config.policy_data_conflict"


def test_the_merge_keeps_the_bundled_data_and_changes_only_the_named_keys(tmp_path):
    gate = {"any": False, "exact": ["2.14.0"], "ranges": []}
    root = consumer(tmp_path, {"freshness": {"max_age_seconds": 3600}, "finding_exceptions": [EXCEPTION],
                               "gates": {"dcp": {"versions": gate}}})
    data = cfg.load(root).policy_data
    merged = {k: json.loads(v) for k, v in data.overlays(POLICIES).items()}
    assert set(merged) == {policydata.INTAKE_IN_BUNDLE, policydata.GATES_IN_BUNDLE}  # never Rego, never other data
    intake = merged[policydata.INTAKE_IN_BUNDLE]
    assert intake["freshness"] == {**INTAKE["freshness"], "max_age_seconds": 3600}
    assert intake["finding_exceptions"] == [*INTAKE["finding_exceptions"], {**EXCEPTION, "overlay": True}]
    assert {k: v for k, v in intake.items() if k not in ("freshness", "finding_exceptions")} == \
        {k: v for k, v in INTAKE.items() if k not in ("freshness", "finding_exceptions")}
    gates = merged[policydata.GATES_IN_BUNDLE]
    assert gates["adapters"]["dcp"] == {**GATES["adapters"]["dcp"], "versions": gate}
    assert gates["formats"] == GATES["formats"]
    assert cfg.load(root).to_json()["policy_data"] == "ckptgate-data.json"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("ckpt") / "model"
    shutil.copytree(FIXTURES / "hf_sharded" / "checkpoint", src)
    return src


def test_added_signers_and_a_shorter_freshness_window_change_the_decision(tmp_path, checkpoint):
    att = demo_attested(checkpoint, tmp_path)
    trusted = consumer(tmp_path / "a", {"signers": [signer(att.public_pem)]})
    rc, doc = decide(trusted, checkpoint, att.attestation)
    assert rc == ExitCode.OK and doc["decision"]["allow"], doc
    plain = consumer(tmp_path / "b", {"finding_exceptions": []})  # the bundled trust alone: untrusted signer
    rc, doc = decide(plain, checkpoint, att.attestation)
    assert rc == ExitCode.VERIFICATION_FAILED and "attestation_rejected" in codes(doc), doc
    time.sleep(2)
    strict = consumer(tmp_path / "c", {"signers": [signer(att.public_pem)], "freshness": {"max_age_seconds": 1}})
    rc, doc = decide(strict, checkpoint, att.attestation)
    assert rc != ExitCode.OK and "attestation_expired" in codes(doc), doc


def test_an_added_finding_exception_admits_the_finding_it_names(tmp_path, checkpoint):
    src = tmp_path / "model"
    shutil.copytree(checkpoint, src)
    (src / "notes.json").write_text("written by our exporter, never loaded\n")
    att = demo_attested(src, tmp_path)
    without = consumer(tmp_path / "a", {"signers": [signer(att.public_pem)]})
    rc, doc = decide(without, src, att.attestation)
    assert rc == ExitCode.INPUT_REJECTED and not doc["decision"]["allow"], doc
    excepted = consumer(tmp_path / "b", {"signers": [signer(att.public_pem)], "finding_exceptions": [EXCEPTION]})
    rc, doc = decide(excepted, src, att.attestation)
    assert rc == ExitCode.OK and "finding_excepted" in codes(doc), doc


def test_no_overlay_excepts_a_code_bearing_finding(tmp_path):
    """Only the bundled policy excepts a finding that bears code (a code file, auto_map, custom pipelines,
    dynamic-module references, pickle globals outside the allowlists)."""
    root = consumer(tmp_path, {"finding_exceptions": [CODE_EXCEPTION]})
    with pytest.raises(cfg.ConfigError) as e:
        cfg.load(root)
    assert e.value.code == "usage.config.policy_data_not_exceptable", e.value.message
    assert "classify.code" in e.value.message


def test_a_discovered_overlay_that_adds_a_signer_is_refused(tmp_path, checkpoint):
    """The pull request's own overlay cannot trust the pull request's own key (issue #30, case 4)."""
    att = demo_attested(checkpoint, tmp_path)
    root = consumer(tmp_path / "a", {"signers": [signer(att.public_pem)]})
    env = {k: v for k, v in os.environ.items() if not k.startswith("CKPTGATE_")}
    out = subprocess.run([sys.executable, "-m", "ckptgate", "decide", str(checkpoint), "--attestation",
                          str(att.attestation), "--json"], cwd=root, env=env, capture_output=True, text=True,
                         timeout=180, check=False)
    assert out.returncode == ExitCode.USAGE, out.stdout + out.stderr
    assert json.loads(out.stdout)["error"]["code"] == "usage.config.widens"
    assert "using configuration" in out.stderr  # a discovered configuration is announced


def test_an_explicit_trust_is_hermetic_the_overlay_adds_no_signer(tmp_path, checkpoint):
    att = demo_attested(checkpoint, tmp_path)
    root = consumer(tmp_path / "a", {"signers": [signer(att.public_pem)]})
    rc, doc = decide(root, checkpoint, att.attestation, "--trust", str(POLICIES / policydata.TRUST_IN_BUNDLE))
    assert rc == ExitCode.VERIFICATION_FAILED and "attestation_rejected" in codes(doc), doc
    roles = {i["role"]: i for i in doc["decision"]["inputs"]}
    assert roles["trust"]["origin"] == "explicit" and roles["overlay"]["origin"] == "explicit", roles
