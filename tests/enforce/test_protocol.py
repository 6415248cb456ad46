"""The worker protocol: the job spec's strict parse and serialise, the framing, the record kinds."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from ckptgate.digest import Digest
from ckptgate.enforce import protocol as wp

DIGEST = Digest.parse("sha256:" + "ab" * 32)


def _spec(**over: Any) -> wp.WorkerSpec:
    fields: dict[str, Any] = {
        "job": "torch_load_bytes",
        "permit": wp.PermitTerms(fixture_digest=DIGEST, loader="torch_load",
                                 required_controls=("seccomp", "user_ns"), decision_id="d"),
        "openat2": True, "namespaces": True, "pid_ns": False,
        "parent_namespaces": {"user": "user:[1]", "net": "net:[1]", "ipc": "ipc:[1]", "pid": None},
        "rlimits": {"AS": 1 << 30, "CPU": 60, "FSIZE": 0, "NOFILE": 64, "NPROC": 64}, "cgroup": "/ckptgate/w1",
        "preimports": ("collections",), "files": (wp.SpecFile(fd=5, relpath="m.pt", sha256="0" * 64),),
        "select": {"m.pt": (("a", 0),)}, "chunk_bytes": 1 << 20, "max_nodes": 1000, "max_depth": 50, "output_fd": 7}
    fields.update(over)
    return wp.WorkerSpec(**fields)


def test_the_spec_round_trips_and_carries_the_fixture_digest_once() -> None:
    spec = _spec()
    doc = json.loads(spec.dumps())
    assert wp.WorkerSpec.loads(spec.dumps()) == wp.WorkerSpec.from_json(doc)
    again = wp.WorkerSpec.loads(spec.dumps())
    assert again == spec and again.to_json() == doc and again.loader == "torch_load"
    assert spec.dumps().count(DIGEST.prefixed().encode()) == 1
    assert isinstance(again.permit.fixture_digest, Digest)
    assert "fixture_digest" not in doc and "loader" not in doc  # only in the permit's terms
    assert again.select == {"m.pt": (("a", 0),)}


@pytest.mark.parametrize(("mutate", "why"), [
    (lambda d: d.pop("chunk_bytes"), "exactly the fields"),
    (lambda d: d.update(extra=1), "exactly the fields"),
    (lambda d: d.update(version=2), "version-1"),
    (lambda d: d.update(job="exec_python"), "unknown job"),
    (lambda d: d["permit"].update(fixture_digest=None), "permit.fixture_digest"),
    (lambda d: d["permit"].update(fixture_digest="sha256:" + "AB" * 32), "permit.fixture_digest"),
    (lambda d: d["permit"].pop("decision_id"), "permit must be"),
    (lambda d: d.update(namespaces=1), "namespaces must be a bool"),
    (lambda d: d["parent_namespaces"].pop("pid"), "parent_namespaces"),
    (lambda d: d["rlimits"].update(AS=-1), "rlimits.AS"),
    (lambda d: d.update(preimports=["os; rm"]), "module names"),
    (lambda d: d["files"][0].update(fd=True), "files[].fd"),
    (lambda d: d["files"][0].update(sha256="AB" * 32), "sha256"),
    (lambda d: d.update(files=[]), "non-empty"),
    (lambda d: d.update(select={"other.pt": [["a"]]}), "names input files"),
    (lambda d: d.update(select={"m.pt": [[1.5]]}), "str/int segments"),
    (lambda d: d.update(max_depth=0), "max_depth"),
])
def test_a_malformed_spec_is_refused(mutate: Any, why: str) -> None:
    doc = json.loads(_spec().dumps())
    mutate(doc)
    with pytest.raises(wp.SpecError, match=why.replace("[", r"\[").replace("]", r"\]")):
        wp.WorkerSpec.from_json(doc)


def test_a_spec_that_is_not_json_or_too_large_is_refused() -> None:
    with pytest.raises(wp.SpecError, match="not JSON"):
        wp.WorkerSpec.loads(b"{")
    with pytest.raises(wp.SpecError, match="too large"):
        wp.WorkerSpec.loads(b" " * (wp.MAX_SPEC + 1))


def test_select_is_only_for_the_bytes_job() -> None:
    with pytest.raises(wp.SpecError, match="bytes job"):
        _spec(job="torch_load")
    assert replace(_spec(), select=None).select is None


def test_framing_and_records() -> None:
    frame = wp.json_frame({"event": "done"})
    kind, length = wp.HEADER.unpack(frame[:wp.HEADER.size])
    assert kind == wp.REC_JSON and json.loads(frame[wp.HEADER.size:]) == {"event": "done"}
    assert length == len(frame) - wp.HEADER.size
    with pytest.raises(ValueError):
        wp.json_frame({"x": float("nan")})
    rec = wp.WorkerError("runtime.worker.load_failed", "boom").record()
    assert set(rec) == wp.RECORD_FIELDS["error"]
    with pytest.raises(AssertionError):
        wp.WorkerError("runtime.anything", "x")


def test_tensor_nbytes() -> None:
    assert wp.tensor_nbytes("float32", [2, 3]) == 24
    assert wp.tensor_nbytes("float8_e8m0fnu", [4]) == 4
    assert wp.tensor_nbytes("complex32", []) == 4
    assert wp.tensor_nbytes("F32", [2]) is None
    assert wp.tensor_nbytes("float32", [-1]) is None
    assert wp.tensor_nbytes("float32", [True]) is None
