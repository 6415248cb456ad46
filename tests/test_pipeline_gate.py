"""End to end: the producer-release gate refuses a committed checkpoint whose trusted statement names
a release (or topology) no qualification vouches for, in the static plane as in the framework plane,
with a top-level code and message that say so and name the nearest qualified rows; the qualified
release of the same bytes is taken in.  The gate is the committed, generated
``policies/ckptgate/config/qualified/data.json``."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from ckptgate.digest import fixture_digest
from ckptgate.errors import PolicyDenied
from ckptgate.inspect import SafeTree, inspect_open_tree
from ckptgate.pipeline import intake
from ckptgate.verify import KeySigner
from ckptgate.verify.dsse import sign_statement
from pipeline_helpers import FIXTURES, REPO, Signer, attest, ckptgate_json, make_signer, qualification

pytestmark = pytest.mark.opa

QUALIFIED = json.loads((REPO / "policies" / "ckptgate" / "config" / "qualified" / "data.json").read_text())


@pytest.fixture(scope="module")
def signer(tmp_path_factory: pytest.TempPathFactory) -> Signer:
    return make_signer(tmp_path_factory.mktemp("signer"))


def _fixture(name: str) -> tuple[Path, dict[str, Any], str]:
    src = FIXTURES / name / "checkpoint"
    with SafeTree.open(src) as tree:
        fmt = str(inspect_open_tree(tree).format)
    return src, json.loads((FIXTURES / name / "meta.json").read_text()), fmt


def _qualified_versions(adapter: str, fmt: str) -> list[str]:
    return list(QUALIFIED["adapters"][adapter]["versions"].get(fmt, []))


@pytest.mark.parametrize(("name", "adapter"), [("dcp_torch_save", "dcp"), ("dcp_hf_safetensors", "dcp"),
                                               ("megatron_torch_dist", "megatron-torch-dist")])
def test_a_static_plane_checkpoint_from_an_unqualified_release_is_refused(name: str, adapter: str, signer: Signer,
                                                                          tmp_path: Path) -> None:
    """The producer-release gate applies in the static plane too: an unqualified release is refused."""
    src, meta, fmt = _fixture(name)
    assert "15.0.0" not in _qualified_versions(adapter, fmt)
    att = attest(signer, src, tmp_path / "att.json", fmt=fmt, meta=meta, version="15.0.0")
    with pytest.raises(PolicyDenied) as e:
        intake(src, tmp_path / "out", attestations=[att], options=signer.options)
    err = e.value
    assert err.code == "policy.producer_release_unqualified"  # the top-level code says what is missing
    assert err.evidence["refusal"] == "policy"
    first = err.reasons[0]
    assert first["code"] == "producer_release_unqualified"
    nearest = _qualified_versions(adapter, fmt)[-1]
    assert f"15.0.0 is not a qualified release for adapter {adapter} reading {fmt}" in err.message
    assert f"qualified: {nearest} (" in err.message
    assert first["evidence"]["nearest_qualified"][0].startswith(nearest)
    assert not (tmp_path / "out").exists()


def test_the_same_dcp_bytes_from_the_qualified_release_are_taken_in(signer: Signer, tmp_path: Path) -> None:
    pytest.importorskip("torch")
    src, meta, fmt = _fixture("dcp_torch_save")
    version = meta["versions"]["torch"]  # the release that wrote these bytes, one of the qualified ones
    assert version in _qualified_versions("dcp", fmt)
    att = attest(signer, src, tmp_path / "att.json", fmt=fmt, meta=meta, version=version)
    res = intake(src, tmp_path / "out", attestations=[att], options=signer.options)
    assert res.outputs


def test_a_megatron_checkpoint_attested_at_an_unqualified_topology_is_refused(signer: Signer, tmp_path: Path) -> None:
    src, meta, fmt = _fixture("megatron_torch_dist")
    with SafeTree.open(src) as tree:
        digest = fixture_digest(tree).digest.prefixed()
    statement = qualification(src, digest, fmt=fmt, meta=meta)
    statement["predicate"]["topology"] = {**statement["predicate"]["topology"], "tp": 4, "world_size": 4}
    att = tmp_path / "att.json"
    att.write_bytes(sign_statement(statement, KeySigner.from_pem(signer.key_path)))
    with pytest.raises(PolicyDenied) as e:
        intake(src, tmp_path / "out", attestations=[att], options=signer.options)
    assert e.value.code == "policy.topology_unqualified"
    assert "not at the attested topology tp=4 pp=1 dp=1 cp=1 ep=1 etp=1 world_size=4" in e.value.message
    assert "qualified: 0.16.1 (tp=2 pp=1 dp=1 cp=1 ep=1 etp=1 world_size=2)" in e.value.message
    assert not (tmp_path / "out").exists()


def test_the_cli_names_the_unqualified_release_at_the_top(signer: Signer, tmp_path: Path) -> None:
    src, meta, fmt = _fixture("dcp_torch_save")
    unqualified = "2.9.1"  # a torch release no retained qualification names
    assert unqualified not in _qualified_versions("dcp", fmt)
    att = attest(signer, src, tmp_path / "att.json", fmt=fmt, meta=meta, version=unqualified)
    proc = ckptgate_json("intake", src, "--out", tmp_path / "out", "--attestation", att, "--trust", signer.trust_file)
    assert proc.returncode == 3, proc.stderr
    doc = json.loads(proc.stdout or proc.stderr)
    error = doc.get("error", doc)
    assert error["code"] == "policy.producer_release_unqualified"
    assert f"torch {unqualified} is not a qualified release for adapter dcp reading dcp-torch-save" in error["message"]
    nearest = re.search(r"qualified: (\S+) \(tp=", error["message"])
    assert nearest is not None and nearest.group(1) in _qualified_versions("dcp", fmt), error["message"]
