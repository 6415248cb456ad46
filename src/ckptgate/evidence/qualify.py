"""Qualification: run an adapter's consolidation on a real fixture, compare with ground truth bit
for bit, retain a result log, and sign a qualification statement about the fixture.

A qualification is evidence for one exact producer version, adapter version, immutable fixture
digest, candidate commit, environment and topology (register claim rule 3).  It is not a claim
about any other version, fixture or topology.  The consolidation goes through the same path as
``ckptgate intake``: inspect -> digest -> decide (action ``qualify``) -> plan -> streaming writer.
A framework-plane fixture is loaded only after a trusted fixture-provenance attestation for its
digest (:mod:`ckptgate.evidence.provenance`).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from ckptgate import __version__
from ckptgate.evidence.candidate import EVIDENCE_PATHS, candidate_commit, dirty_paths, head_commit
from ckptgate.evidence.errors import EvidenceError, QualificationFailed
from ckptgate.consolidate.plan import PlanError
from ckptgate.digest import Digest
from ckptgate.errors import InputRejected, PolicyDenied, RuntimeFailure, VerificationError

FIXTURES_DIR = Path("tests") / "fixtures" / "data"
STORE_DIR = Path("attestations")
EVIDENCE_DIR = STORE_DIR / "evidence"
DEFAULT_KEY = Path("..") / "shared" / "keys" / "ci-qualification.ed25519.pem"
"""Relative to the repository root; the private key is read, never copied or printed."""
GATES_DATA = Path("policies") / "ckptgate" / "config" / "gates" / "data.json"
INTAKE_DATA = Path("policies") / "ckptgate" / "config" / "intake" / "data.json"
DEFAULT_VALIDITY = timedelta(days=180)
LOG_VERSION = 1
CHECKS = ("expected_digest", "policy_allows_qualify", "tensor_names", "dtype_shape", "tensor_bytes_bit_exact")
_AXES = ("tp", "pp", "dp", "cp", "ep", "etp")


@dataclass(frozen=True, slots=True, kw_only=True)
class Fixture:
    """One generated fixture: ``checkpoint/``, ``expected.safetensors`` and ``meta.json``."""

    name: str
    root: Path
    meta: Mapping[str, Any] = field(repr=False)

    def __post_init__(self) -> None:
        for need in ("format", "producer", "versions", "topology"):
            if need not in self.meta:
                raise EvidenceError("evidence.fixture.meta_field", f"fixture {self.name}: meta.json has no {need!r}",
                                    evidence={"fixture": self.name, "field": need})
        if not self.checkpoint.is_dir() or not self.expected.is_file():
            raise EvidenceError("evidence.fixture.layout",
                                f"fixture {self.name} needs checkpoint/ and expected.safetensors",
                                evidence={"fixture": str(self.root)})

    @classmethod
    def load(cls, root: Path) -> Fixture:
        try:
            meta = json.loads((root / "meta.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise EvidenceError("evidence.fixture.meta_unreadable", f"cannot read {root / 'meta.json'}: {e}",
                                evidence={"fixture": str(root)}) from None
        if not isinstance(meta, dict):
            raise EvidenceError("evidence.fixture.meta_unreadable", f"{root / 'meta.json'} is not an object")
        return cls(name=root.name, root=root, meta=meta)

    @property
    def checkpoint(self) -> Path:
        return self.root / "checkpoint"

    @property
    def expected(self) -> Path:
        return self.root / "expected.safetensors"

    @property
    def format(self) -> str:
        return str(self.meta["format"])

    def producer(self, gate_producer: str | None = None) -> dict[str, str]:
        """The producing package and its exact version from ``meta.json``.

        The package is the adapter gate's producer when it names one (``megatron-core``), else the
        first component of the producer call (``huggingface_hub.save_torch_state_dict``).
        """
        call = str(self.meta["producer"])
        package = gate_producer if gate_producer and gate_producer != "*" else call.split(".", 1)[0].split(" ", 1)[0]
        version = (self.meta.get("versions") or {}).get(package)
        if not isinstance(version, str) or not version:
            raise EvidenceError("evidence.fixture.producer_version",
                                f"fixture {self.name}: no exact version recorded for producer {package!r}",
                                evidence={"fixture": self.name, "producer": call})
        return {"name": package, "version": version}

    def topology(self) -> dict[str, Any]:
        """The predicate topology: parallel degrees (1 when the producer did not use the axis)."""
        raw = dict(self.meta["topology"])
        out: dict[str, Any] = {axis: _degree(raw.get(axis, 1)) for axis in _AXES}
        if "dp" not in raw and ("dp_shard" in raw or "dp_replicate" in raw):
            out["dp"] = _degree(raw.get("dp_shard", 1)) * _degree(raw.get("dp_replicate", 1))
        out["world_size"] = _degree(raw.get("world_size", 1))
        if "fsdp" in raw:
            out["fsdp"] = bool(raw["fsdp"])
        if "zero_stage" in raw:
            out["zero_stage"] = raw["zero_stage"]
        return out


def _degree(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise EvidenceError("evidence.fixture.topology", f"topology degree {v!r} is not a positive integer")
    return v


def list_fixtures(repo: Path) -> list[Fixture]:
    base = repo / FIXTURES_DIR
    if not base.is_dir():
        return []
    return [Fixture.load(d) for d in sorted(base.iterdir()) if (d / "meta.json").is_file()]


def find_fixture(repo: Path, name_or_path: str) -> Fixture:
    p = Path(name_or_path)
    root = p if (p / "meta.json").is_file() else repo / FIXTURES_DIR / name_or_path
    if not (root / "meta.json").is_file():
        known = [f.name for f in list_fixtures(repo)]
        raise EvidenceError("evidence.fixture.unknown", f"no fixture {name_or_path!r}",
                            evidence={"known": known}, advice=f"Known fixtures: {', '.join(known) or 'none'}.")
    return Fixture.load(root.resolve())


def adapter_for_format(repo: Path, fmt: str) -> str | None:
    """The adapter the gates data names for an inspected format (None when none can consolidate it)."""
    try:
        gates = json.loads((repo / GATES_DATA).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    entry = (gates.get("formats") or {}).get(fmt) or {}
    adapter = entry.get("adapter")
    return adapter if isinstance(adapter, str) else None


def gate_producer(repo: Path, adapter: str) -> str | None:
    """The producer the adapter's version gate names (``*`` or absent: any)."""
    try:
        gates = json.loads((repo / GATES_DATA).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    producer = ((gates.get("adapters") or {}).get(adapter) or {}).get("producer")
    return producer if isinstance(producer, str) else None


def fixture_format(repo: Path, fixture: Fixture) -> str:
    """The format the gates data knows the fixture by: ``meta.json``'s when the gates data lists it
    (``peft-lora``), else the format the static inspection reports (``deepspeed-zero`` for a fixture
    recorded as ``deepspeed-zero2``).  Inspection reads, never loads; a refused tree keeps the meta format."""
    from ckptgate.errors import Error
    from ckptgate.inspect import SafeTree, inspect_open_tree

    try:
        gates = json.loads((repo / GATES_DATA).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return fixture.format
    if fixture.format in (gates.get("formats") or {}):
        return fixture.format
    try:
        with SafeTree.open(fixture.checkpoint) as tree:
            inspected = inspect_open_tree(tree).format
    except Error:
        return fixture.format
    return inspected if isinstance(inspected, str) and inspected else fixture.format


def fixture_adapter(repo: Path, fixture: Fixture) -> str | None:
    """The adapter that consolidates the fixture's format (:func:`fixture_format`), or None."""
    return adapter_for_format(repo, fixture_format(repo, fixture))


def _validity(repo: Path) -> timedelta:
    try:
        cfg = json.loads((repo / INTAKE_DATA).read_text(encoding="utf-8"))
        return timedelta(seconds=int(cfg["freshness"]["max_age_seconds"]))
    except (OSError, ValueError, KeyError, TypeError):
        return DEFAULT_VALIDITY


def environment() -> dict[str, Any]:
    """Where the run happened (no accelerator is used: consolidation moves bytes on the CPU)."""
    try:
        torch_version: str | None = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = None
    return {"python": platform.python_version(), "torch": torch_version,
            "os": f"{platform.system()} {platform.release()}"[:256], "arch": platform.machine() or "unknown",
            "accelerator": "none (cpu)"}


# --------------------------------------------------------------------------------------------- compare
def _tensor_digests(path: Path) -> dict[str, dict[str, Any]]:
    """name -> {dtype, shape, sha256 of the raw bytes}, read through our strict header validator."""
    from ckptgate.inspect.hashed import HashedFile
    from ckptgate.inspect.safetensors import read_header

    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        with HashedFile.over(fd, path.name) as src:
            header = read_header(src, size, path=path.name)
        out: dict[str, dict[str, Any]] = {}
        for t in header.tensors:
            begin, end = t.data_offsets
            h = hashlib.sha256()
            pos, left = header.data_start + begin, end - begin
            while left > 0:
                chunk = os.pread(fd, min(left, 8 << 20), pos)
                if not chunk:
                    raise EvidenceError("evidence.compare.short_read", f"{path.name}: short read at {pos}")
                h.update(chunk)
                pos += len(chunk)
                left -= len(chunk)
            out[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "sha256": h.hexdigest(), "file": path.name}
        return out
    finally:
        os.close(fd)


def compare_outputs(out_dir: Path, expected: Path) -> dict[str, Any]:
    """Compare every tensor written to ``out_dir`` with ``expected`` (names, dtype, shape, bytes)."""
    got: dict[str, dict[str, Any]] = {}
    for f in sorted(out_dir.glob("*.safetensors")):
        for name, info in _tensor_digests(f).items():
            if name in got:
                raise EvidenceError("evidence.compare.duplicate", f"tensor {name!r} written twice")
            got[name] = info
    want = _tensor_digests(expected)
    rows = []
    for name in sorted(set(got) | set(want)):
        g, w = got.get(name), want.get(name)
        rows.append({"name": name, "expected": w, "actual": g,
                     "names_equal": g is not None and w is not None,
                     "dtype_shape_equal": bool(g and w and g["dtype"] == w["dtype"] and g["shape"] == w["shape"]),
                     "bytes_equal": bool(g and w and g["sha256"] == w["sha256"])})
    return {"tensors": rows,
            "tensor_names": all(r["names_equal"] for r in rows),
            "dtype_shape": all(r["dtype_shape_equal"] for r in rows),
            "tensor_bytes_bit_exact": all(r["bytes_equal"] for r in rows)}


# --------------------------------------------------------------------------------------------- run
@dataclass(frozen=True, slots=True, kw_only=True)
class QualificationResult:
    """One qualification run: its status, the stored attestation and the retained log."""

    fixture: str
    adapter: str
    status: str
    fixture_digest: Digest
    candidate_commit: str
    attestation: Path | None
    log: Path
    log_sha256: str
    superseded: tuple[Path, ...] = ()
    provenance: tuple[str, ...] = ()
    """Repository-relative provenance attestations the qualify decision was taken with (framework plane)."""

    def __post_init__(self) -> None:
        if self.status not in ("passed", "failed", "error"):
            raise ValueError(f"bad status {self.status!r}")

    def to_json(self) -> dict[str, Any]:
        return {"fixture": self.fixture, "adapter": self.adapter, "status": self.status,
                "fixture_digest": self.fixture_digest.prefixed(), "candidate_commit": self.candidate_commit,
                "attestation": str(self.attestation) if self.attestation else None, "log": str(self.log),
                "log_sha256": "sha256:" + self.log_sha256, "superseded": [str(p) for p in self.superseded],
                "provenance": list(self.provenance)}


def _consolidate(repo: Path, fixture: Fixture, out_dir: Path, *, options: Any, commit: str, now: datetime,
                 key: Path) -> dict[str, Any]:
    """Inspect, digest, decide (action qualify), plan and write the fixture into ``out_dir``.

    When the only deny reason is a missing provenance attestation (a framework-plane fixture), a
    stored provenance statement that verifies for this digest and commit is used, else one is
    signed with ``key`` after the committed bytes are checked (:mod:`ckptgate.evidence.provenance`),
    stored, and the decision is taken again with it.  A new statement that policy still refuses
    is removed again; nothing is loaded before an allow decision.
    """
    from ckptgate.evidence import provenance as prov
    from ckptgate.inspect import SafeTree
    from ckptgate.pipeline import consolidate_into, engine_for, evaluate, judge, load_trust
    from ckptgate.verify import KeySigner

    trust = load_trust(options)
    used: dict[str, Any] | None = None
    with SafeTree.open(fixture.checkpoint) as tree, engine_for(options, trust) as engine:
        ev = evaluate(tree, attestations=[], engine=engine, trust=trust, action="qualify", now=now,
                      candidate_commit=commit)
        if prov.provenance_needed(ev.decision):
            stored = prov.usable_provenance(repo, ev.digest.digest, trust=trust, commit=commit, now=now)
            fresh: Path | None = None
            if not stored:
                envelope = prov.sign_provenance(repo, fixture, tree, ev.digest, signer=KeySigner.from_pem(key),
                                                trust=trust, commit=commit, now=now)
                fresh = prov.store_provenance(repo, envelope)
                stored = [fresh]
            ev = judge(ev.inspection, ev.digest, attestations=stored, engine=engine, trust=trust, action="qualify",
                       now=now, candidate_commit=commit, containment=ev.containment)  # same bytes: not measured again
            if fresh is not None and not ev.decision.allow:
                prov.discard_provenance(repo, fresh)
            superseded = prov.supersede_provenance(repo, fresh, ev.digest.digest) if fresh and ev.decision.allow \
                else ()
            used = {"attestations": [_rel(repo, p) for p in stored], "signed_now": fresh is not None,
                    "superseded": [_rel(repo, p) for p in superseded]}
        written = consolidate_into(tree, ev, out_dir, max_shard_bytes=2 << 30).outputs
    d = ev.decision
    return {"fixture_digest": ev.digest.digest, "inspected_format": ev.inspection.format,
            "decision": {"id": d.decision_id, "allow": d.allow, "plane": d.plane,
                         "policy_revision": d.policy_revision},
            "provenance": used,
            "outputs": [{"file": w.filename, "size": w.size, "sha256": w.sha256} for w in written]}


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def resolve_key(repo: Path, key: Path | str | None) -> Path:
    """``--key``, else ``$CKPTGATE_SIGNING_KEY``, else ``../shared/keys/ci-qualification.ed25519.pem``."""
    chosen = key or os.environ.get("CKPTGATE_SIGNING_KEY") or (repo / DEFAULT_KEY)
    p = Path(chosen)
    if not p.is_file():
        raise EvidenceError("evidence.qualify.no_key", f"no signing key at {p}",
                            advice="Pass --key PEM or set CKPTGATE_SIGNING_KEY; CI uses ../shared/keys/.")
    return p


def qualify(repo: Path, fixture: Fixture, adapter: str, *, key: Path | str | None = None, options: Any = None,
            allow_dirty: bool = False, now: datetime | None = None) -> QualificationResult:
    """Qualify ``adapter`` on ``fixture``; store the signed statement and the retained log under ``repo``.

    Raises :class:`EvidenceError` for a dirty tree (unless ``allow_dirty``) or an adapter that does
    not consolidate the fixture's format, and :class:`QualificationFailed` after storing a signed
    ``failed`` result when the output differs from ``expected.safetensors``.
    """
    from ckptgate.pipeline import EngineOptions, load_trust
    from ckptgate.verify import AttestationStore, KeySigner
    from ckptgate.verify.statement import iso_utc, qualification_statement
    from ckptgate.verify import sign_statement, verify_attestation

    repo = repo.resolve()
    options = options or EngineOptions(policy_dir=repo / "policies")
    dirty = dirty_paths(repo, exclude=EVIDENCE_PATHS)
    if dirty and not allow_dirty:
        raise EvidenceError("evidence.qualify.dirty_tree",
                            f"the work tree has {len(dirty)} uncommitted change(s); evidence must name exact code",
                            evidence={"paths": dirty[:50]},
                            advice="Commit or stash the changes (or pass --allow-dirty for a local trial run).")
    fmt = fixture_format(repo, fixture)
    named = adapter_for_format(repo, fmt)
    if named != adapter:
        raise EvidenceError("evidence.qualify.adapter_mismatch",
                            f"adapter {adapter!r} does not consolidate format {fmt!r} "
                            f"(the gates data names {named!r})",
                            evidence={"fixture": fixture.name, "format": fmt, "adapter": named})
    key_path = resolve_key(repo, key)
    signer = KeySigner.from_pem(key_path)
    now = (now or datetime.now(timezone.utc)).replace(microsecond=0)
    commit = candidate_commit(repo)
    producer = fixture.producer(gate_producer(repo, adapter))
    topology = fixture.topology()
    env = environment()
    expected_sha = _sha256_file(fixture.expected)
    checks: dict[str, bool] = {"expected_digest": expected_sha == (fixture.meta.get("expected") or {}).get("sha256")}
    log: dict[str, Any] = {
        "log_version": LOG_VERSION, "ckptgate_version": __version__, "fixture": fixture.name,
        "fixture_manifest": _rel(repo, fixture.root / "meta.json"), "format": fixture.format,
        "producer": producer, "producer_call": fixture.meta["producer"],
        "adapter": {"name": adapter, "version": __version__},
        "candidate_commit": commit, "head_commit": head_commit(repo), "tree_dirty": bool(dirty),
        "dirty_paths": dirty[:50], "environment": env, "topology": topology, "topology_raw": fixture.meta["topology"],
        "expected": {"file": _rel(repo, fixture.expected), "sha256": expected_sha}, "started_at": iso_utc(now),
    }
    status = "error"
    digest: Digest | None = None
    with tempfile.TemporaryDirectory(prefix="ckptgate-qualify-") as tmp:
        out_dir = Path(tmp) / "out"
        out_dir.mkdir()
        try:
            run = _consolidate(repo, fixture, out_dir, options=options, commit=commit, now=now, key=key_path)
            digest = run["fixture_digest"]
            log.update({**run, "fixture_digest": digest.prefixed()})
            checks["policy_allows_qualify"] = bool(run["decision"]["allow"])
            comparison = compare_outputs(out_dir, fixture.expected)
            log["comparison"] = comparison["tensors"]
            for c in ("tensor_names", "dtype_shape", "tensor_bytes_bit_exact"):
                checks[c] = comparison[c]
            status = "passed" if all(checks.get(c) for c in CHECKS) else "failed"
        except (PlanError, RuntimeFailure) as e:
            # The adapter itself failed: that is a result worth signing.  Anything else (engine
            # unavailable, policy deny, bad input) raises and nothing is signed.
            if e.code.startswith("plan.format.unsupported"):
                raise EvidenceError("evidence.qualify.no_runtime",
                                    f"the consolidation runtime has no adapter for {fixture.format!r} yet: "
                                    f"{e.message}", evidence={"fixture": fixture.name}) from None
            log["error"] = e.to_json()["error"]
            status = "error"
    if digest is None:
        digest = _measure(fixture)
    log["checks"] = checks
    log["status"] = status
    log_path = repo / EVIDENCE_DIR / digest.filename_stem() / f"{adapter}.log.json"
    log_raw = (json.dumps(log, indent=2, sort_keys=True) + "\n").encode()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_bytes(log_raw)
    log_sha = hashlib.sha256(log_raw).hexdigest()
    statement = qualification_statement(
        subject_name=fixture.name, fixture_digest=digest, manifest=_rel(repo, fixture.root / "meta.json"),
        producer=producer, adapter={"name": adapter, "version": __version__}, candidate_commit=commit,
        environment=env, topology=topology, status=status, checks_run=list(checks),
        evidence_digest="sha256:" + log_sha, evidence_location=_rel(repo, log_path),
        issued_at=now, valid_for=_validity(repo))
    envelope = sign_statement(statement, signer)
    # Storing is only useful when the trust data accepts the signer: verify before storing.
    verify_attestation(envelope, source="<new>", trust=load_trust(options), measured_digest=digest, now=now)
    store = AttestationStore(repo / STORE_DIR)
    superseded = _supersede(store, digest, adapter)
    stored = store.add(envelope)
    result = QualificationResult(fixture=fixture.name, adapter=adapter, status=status, fixture_digest=digest,
                                 candidate_commit=commit, attestation=stored, log=log_path, log_sha256=log_sha,
                                 superseded=superseded,
                                 provenance=tuple((log.get("provenance") or {}).get("attestations") or ()))
    if status != "passed":
        failing = [c for c in CHECKS if not checks.get(c)]
        raise QualificationFailed("evidence.qualify.failed",
                                  f"{adapter} on {fixture.name}: {status}; failing checks: {', '.join(failing)}",
                                  evidence=result.to_json())
    return result


def _supersede(store: Any, digest: Digest, adapter: str) -> tuple[Path, ...]:
    """Remove earlier qualifications of the same adapter on the same fixture: their log is replaced."""
    from ckptgate.verify.statement import field_at
    from ckptgate.verify.store import statement_of

    removed = []
    for p in store.find(digest):
        try:
            _fmt, stmt, _ = statement_of(p.read_bytes())
        except VerificationError:
            continue
        if field_at(stmt, "predicate", "adapter", "name") == adapter:  # any shape, for unknown predicate types
            p.unlink()
            removed.append(p)
    return tuple(removed)


def _measure(fixture: Fixture) -> Digest:
    from ckptgate.digest import fixture_digest
    from ckptgate.inspect import SafeTree

    with SafeTree.open(fixture.checkpoint) as tree:
        return fixture_digest(tree).digest


def _rel(repo: Path, p: Path) -> str:
    try:
        return p.resolve().relative_to(repo).as_posix()
    except ValueError:
        return str(p)


def qualifiable(repo: Path) -> list[tuple[Fixture, str]]:
    """Every fixture whose format the gates data maps to an adapter, with that adapter."""
    out = []
    for f in list_fixtures(repo):
        adapter = fixture_adapter(repo, f)
        if adapter is not None:
            out.append((f, adapter))
    return out


def qualify_all(repo: Path, *, key: Path | str | None = None, options: Any = None, allow_dirty: bool = False,
                now: datetime | None = None) -> list[dict[str, Any]]:
    """Qualify every fixture that has an adapter; a format without a runtime yet is reported as skipped."""
    repo = repo.resolve()
    dirty = dirty_paths(repo, exclude=EVIDENCE_PATHS)
    if dirty and not allow_dirty:
        raise EvidenceError("evidence.qualify.dirty_tree",
                            f"the work tree has {len(dirty)} uncommitted change(s); evidence must name exact code",
                            evidence={"paths": dirty[:50]})
    results: list[dict[str, Any]] = []
    for fixture, adapter in qualifiable(repo):
        try:
            r = qualify(repo, fixture, adapter, key=key, options=options, allow_dirty=True, now=now)
            results.append(r.to_json())
        except EvidenceError as e:
            results.append({"fixture": fixture.name, "adapter": adapter, "status": "skipped",
                            "reason": f"[{e.code}] {e.message}"})
        except (InputRejected, PolicyDenied, VerificationError) as e:
            # Inspection or policy refuses this fixture today (e.g. no consolidation runtime for its
            # layout yet): nothing was run or signed; the matrix keeps the adapter unqualified.
            results.append({"fixture": fixture.name, "adapter": adapter, "status": "skipped",
                            "reason": f"[{e.code}] {e.message}"})
        except QualificationFailed as e:
            results.append({**e.evidence, "reason": e.message})
    return results


__all__ = ["CHECKS", "Fixture", "QualificationResult", "adapter_for_format", "compare_outputs", "environment",
           "find_fixture", "fixture_adapter", "fixture_format", "list_fixtures", "qualifiable", "qualify", "qualify_all",
           "resolve_key"]
