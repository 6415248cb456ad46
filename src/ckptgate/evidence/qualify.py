"""Qualification: run an adapter's consolidation on a real fixture, compare with ground truth bit
for bit, retain a result log, and sign a qualification statement about the fixture.

A qualification is evidence for one exact producer version, adapter version, immutable fixture
digest, candidate commit, environment and topology (register claim rule 3).  It is not a claim
about any other version, fixture or topology.  The consolidation goes through the same path as
``ckptgate intake``: inspect -> digest -> decide (action ``qualify``) -> plan -> streaming writer.
The fixture is inspected and hashed once; that measurement names its format, is decided on and
is the digest the statement is about.  A framework-plane fixture is loaded only after a trusted
fixture-provenance attestation for its digest (:mod:`ckptgate.evidence.provenance`).

The fixtures catalogue is :mod:`ckptgate.evidence.fixtures`, the gates data lookups
:mod:`ckptgate.evidence.gates`, the environment record :mod:`ckptgate.evidence.environment`, the
output comparison :mod:`ckptgate.evidence.compare` and the store clean-up :mod:`ckptgate.evidence.stored`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import tempfile
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ckptgate import __version__
from ckptgate.consolidate.hf.engine import expected_parameters
from ckptgate.consolidate.hf.source import HfConfig, read_hf_config
from ckptgate.consolidate.plan import PlanError
from ckptgate.decide.options import EngineOptions, engine_for, load_trust
from ckptgate.digest import Digest, FixtureDigest, fixture_digest
from ckptgate.errors import Error, InputRejected, PolicyDenied, RuntimeFailure, VerificationError
from ckptgate.evidence import provenance as prov
from ckptgate.evidence.candidate import candidate_commit, dirty_paths, head_commit
from ckptgate.evidence.compare import compare_outputs
from ckptgate.evidence.environment import environment, runtime_lock
from ckptgate.evidence.errors import EvidenceError, QualificationFailed
from ckptgate.evidence.fixtures import Fixture, repo_relative, resolve_key
from ckptgate.evidence.gates import adapter_for_format, fixture_format, gate_producer, qualifiable, validity
from ckptgate.evidence.layout import RepoLayout, as_layout
from ckptgate.evidence.logits import LOGITS_CHECK, compare_logits, published_parameters
from ckptgate.evidence.releases import vouched_releases
from ckptgate.evidence.stored import supersede_qualifications
from ckptgate.inspect import DeferredCrcs, Inspection, SafeTree, inspect_open_tree
from ckptgate.pipeline import consolidate_into, judge
from ckptgate.verify import AttestationStore, KeySigner, sign_statement, verify_attestation
from ckptgate.verify.statement import iso_utc, qualification_statement

LOG_VERSION = 1
CHECKS = ("expected_digest", "policy_allows_qualify", "tensor_names", "dtype_shape", "tensor_bytes_bit_exact")
#: A mapping qualification (a fixture whose expected output is the producer's logits): the intake
#: through ``--hf-config`` publishes exactly the parameters the table expects, and transformers'
#: logits on the fixture's tokens match the producer's.
MAPPING_CHECKS = ("expected_digest", "policy_allows_qualify", "hf_parameters", LOGITS_CHECK)


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
    log_sha256: Digest
    superseded: tuple[Path, ...] = ()
    provenance: tuple[str, ...] = ()
    """Repository-relative provenance attestations the qualify decision was taken with (framework plane)."""

    def __post_init__(self) -> None:
        if self.status not in ("passed", "failed", "error"):
            raise ValueError(f"bad status {self.status!r}")

    def to_json(self) -> dict[str, Any]:
        return {
            "fixture": self.fixture,
            "adapter": self.adapter,
            "status": self.status,
            "fixture_digest": self.fixture_digest.prefixed(),
            "candidate_commit": self.candidate_commit,
            "attestation": str(self.attestation) if self.attestation else None,
            "log": str(self.log),
            "log_sha256": self.log_sha256.prefixed(),
            "superseded": [str(p) for p in self.superseded],
            "provenance": list(self.provenance),
        }


def _measure(tree: SafeTree) -> tuple[Inspection, FixtureDigest]:
    """Inspect and hash the fixture in one read: the CRC-32 of torch-zip entries is checked on the
    bytes the digest reads, as in :func:`ckptgate.pipeline.evaluate`."""
    crcs = DeferredCrcs()
    inspection = inspect_open_tree(tree, verify_crc=crcs)
    digest = fixture_digest(tree, apart=crcs.reader)
    return inspection.with_findings(crcs.findings()), digest


def _consolidate(
    repo: RepoLayout,
    fixture: Fixture,
    tree: SafeTree,
    inspection: Inspection,
    digest: FixtureDigest,
    out_dir: Path,
    *,
    options: EngineOptions,
    commit: str,
    now: datetime,
    key: Path,
    hf: HfConfig | None = None,
    worker: bool = False,
) -> dict[str, Any]:
    """Decide (action qualify) on the measured fixture, plan and write it into ``out_dir``.

    When the only deny reason is a missing provenance attestation (a framework-plane fixture), a
    stored provenance statement that verifies for this digest and commit is used, else one is
    signed with ``key`` after the committed bytes are checked (:mod:`ckptgate.evidence.provenance`),
    stored, and the decision is taken again with it.  A new statement that policy still refuses
    is removed again; nothing is loaded before an allow decision.
    """
    trust = load_trust(options)
    used: dict[str, Any] | None = None
    with engine_for(options, trust) as engine:
        ev = judge(
            inspection,
            digest,
            attestations=[],
            engine=engine,
            trust=trust,
            action="qualify",
            now=now,
            candidate_commit=commit,
        )
        if prov.provenance_needed(ev.decision):
            stored = prov.usable_provenance(repo, digest.digest, trust=trust, commit=commit, now=now)
            fresh: Path | None = None
            if not stored:
                envelope = prov.sign_provenance(
                    repo, fixture, tree, digest, signer=KeySigner.from_pem(key), trust=trust, commit=commit, now=now
                )
                fresh = prov.store_provenance(repo, envelope)
                stored = [fresh]
            ev = judge(
                inspection,
                digest,
                attestations=stored,
                engine=engine,
                trust=trust,
                action="qualify",
                now=now,
                candidate_commit=commit,
                containment=ev.containment,
            )  # same bytes: not measured again
            if fresh is not None and not ev.decision.allow:
                prov.discard_provenance(repo, fresh)
            superseded = prov.supersede_provenance(repo, fresh, digest.digest) if fresh and ev.decision.allow else ()
            used = {
                "attestations": [repo_relative(repo, p) for p in stored],
                "signed_now": fresh is not None,
                "superseded": [repo_relative(repo, p) for p in superseded],
            }
        done = consolidate_into(tree, ev, out_dir, max_shard_bytes=2 << 30, hf=hf, worker=worker)
    written = done.outputs
    d = ev.decision
    return {
        "fixture_digest": digest.digest.prefixed(),
        "inspected_format": inspection.format,
        "decision": {"id": d.decision_id, "allow": d.allow, "plane": d.plane, "policy_revision": d.policy_revision},
        "provenance": used,
        # where the adapter's trees came from: the static reader, or torch.load in the contained worker
        "trees_from": done.plan_report.get("trees_from"),
        "outputs": [{"file": w.filename, "size": w.size, "sha256": w.sha256} for w in written],
    }


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def qualify(
    repo: Path | RepoLayout,
    fixture: Fixture,
    adapter: str,
    *,
    key: Path | str | None = None,
    options: EngineOptions | None = None,
    allow_dirty: bool = False,
    now: datetime | None = None,
) -> QualificationResult:
    """Qualify ``adapter`` on ``fixture``; store the signed statement and the retained log under ``repo``.

    Raises :class:`EvidenceError` for a dirty tree (unless ``allow_dirty``) or an adapter that does
    not consolidate the fixture's format, and :class:`QualificationFailed` after storing a signed
    ``failed`` result when the output differs from ``expected.safetensors``.  ``repo`` is the
    repository's :class:`~ckptgate.evidence.layout.RepoLayout` (a path: ckptgate's own layout there).
    """
    layout = as_layout(repo)
    repo = layout.root
    options = options or EngineOptions(policy_dir=layout.policies)
    dirty = dirty_paths(repo, exclude=layout.evidence_paths)
    if dirty and not allow_dirty:
        raise EvidenceError(
            "evidence.qualify.dirty_tree",
            f"the work tree has {len(dirty)} uncommitted change(s); evidence must name exact code",
            evidence={"paths": dirty[:50]},
            advice="Commit or stash the changes (or pass --allow-dirty for a local trial run).",
        )
    with contextlib.ExitStack() as stack:
        refused: Error | None = None  # inspection refused the tree: raised after the adapter check, as before
        try:
            tree = stack.enter_context(SafeTree.open(fixture.checkpoint))
            inspection, measured = _measure(tree)
        except Error as e:
            refused = e
        fmt = fixture.format if refused is not None else fixture_format(layout, fixture, inspection)
        named = adapter_for_format(layout, fmt)
        if named != adapter:
            raise EvidenceError(
                "evidence.qualify.adapter_mismatch",
                f"adapter {adapter!r} does not consolidate format {fmt!r} (the gates data names {named!r})",
                evidence={"fixture": fixture.name, "format": fmt, "adapter": named},
            )
        if refused is not None:
            raise refused
        digest = measured.digest
        key_path = resolve_key(repo, key)
        signer = KeySigner.from_pem(key_path)
        now = (now or datetime.now(UTC)).replace(microsecond=0)
        commit = candidate_commit(repo, exclude=layout.evidence_paths)
        producer = fixture.producer(gate_producer(layout, adapter))
        topology = fixture.topology()
        env = environment()
        # A runtime qualification is about the worker's torch: its framework files are loaded in the
        # contained worker even where the static reader could read them.
        runtime = runtime_lock(env)
        mapping = fixture.expected_kind == "logits"
        hf = read_hf_config(fixture.root / "hf_config") if mapping else None
        required = MAPPING_CHECKS if mapping else CHECKS
        expected_sha = _sha256_file(fixture.expected)
        checks: dict[str, bool] = {
            "expected_digest": expected_sha == (fixture.meta.get("expected") or {}).get("sha256")
        }
        log: dict[str, Any] = {
            "log_version": LOG_VERSION,
            "ckptgate_version": __version__,
            "fixture": fixture.name,
            "fixture_manifest": repo_relative(layout, fixture.root / "meta.json"),
            "format": fixture.format,
            "producer": producer,
            "producer_call": fixture.meta["producer"],
            "adapter": {"name": adapter, "version": __version__},
            "candidate_commit": commit,
            "head_commit": head_commit(repo),
            "tree_dirty": bool(dirty),
            "dirty_paths": dirty[:50],
            "environment": env,
            "topology": topology,
            "topology_raw": fixture.meta["topology"],
            "expected": {"file": repo_relative(layout, fixture.expected), "sha256": expected_sha},
            "started_at": iso_utc(now),
        }
        if hf is not None:
            log["mapping"] = {"family": hf.declared.family, "hf_config": hf.to_json()}
        status = "error"
        with tempfile.TemporaryDirectory(prefix="ckptgate-qualify-") as tmp:
            out_dir = Path(tmp) / "out"
            out_dir.mkdir()
            try:
                run = _consolidate(
                    layout,
                    fixture,
                    tree,
                    inspection,
                    measured,
                    out_dir,
                    options=options,
                    commit=commit,
                    now=now,
                    key=key_path,
                    hf=hf,
                    worker=runtime is not None,
                )
                log.update(run)
                checks["policy_allows_qualify"] = bool(run["decision"]["allow"])
                if hf is not None:
                    published = published_parameters(out_dir)
                    checks["hf_parameters"] = published == expected_parameters(hf.declared)
                    logits = compare_logits(out_dir, fixture.expected, hf.declared.symbols["vocab_size"])
                    log["mapping"]["logits"] = logits
                    checks[LOGITS_CHECK] = bool(logits["passed"])
                else:
                    comparison = compare_outputs(out_dir, fixture.expected)
                    log["comparison"] = comparison["tensors"]
                    for c in ("tensor_names", "dtype_shape", "tensor_bytes_bit_exact"):
                        checks[c] = comparison[c]
                status = "passed" if all(checks.get(c) for c in required) else "failed"
            except (PlanError, RuntimeFailure) as e:
                # The adapter itself failed: that is a result worth signing.  Anything else (engine
                # unavailable, policy deny, bad input) raises and nothing is signed.
                if e.code.startswith("plan.format.unsupported"):
                    raise EvidenceError(
                        "evidence.qualify.no_runtime",
                        f"the consolidation runtime has no adapter for {fixture.format!r} yet: {e.message}",
                        evidence={"fixture": fixture.name},
                    ) from None
                log["error"] = e.to_json()["error"]
                status = "error"
        releases: tuple[dict[str, str], ...] = ()
        if status == "passed" and fixture.written_by():
            # Other releases that wrote these very bytes: each named only with its signed provenance.
            found = vouched_releases(
                layout,
                fixture,
                tree,
                measured,
                producer=producer,
                gate_producer=gate_producer(layout, adapter),
                key=key_path,
                trust=load_trust(options),
                commit=commit,
                now=now,
            )
            releases = found.named
            log["producer_releases"] = found.to_log()
    log["checks"] = checks
    log["status"] = status
    # A runtime environment's qualification is its own row beside the one from ckptgate's own
    # environment: its log has its own name, and it supersedes only the same runtime's.
    log_name = f"{adapter}.log.json" if runtime is None else f"{adapter}@{runtime}.log.json"
    log_path = layout.evidence_dir / digest.filename_stem() / log_name
    log_raw = (json.dumps(log, indent=2, sort_keys=True) + "\n").encode()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_bytes(log_raw)
    log_sha = Digest.from_hex(hashlib.sha256(log_raw).hexdigest())
    statement = qualification_statement(
        subject_name=fixture.name,
        fixture_digest=digest,
        manifest=repo_relative(layout, fixture.root / "meta.json"),
        producer=producer,
        adapter={"name": adapter, "version": __version__},
        candidate_commit=commit,
        environment=env,
        topology=topology,
        status=status,
        checks_run=list(checks),
        evidence_digest=log_sha.prefixed(),
        evidence_location=repo_relative(layout, log_path),
        issued_at=now,
        valid_for=validity(layout),
        producer_releases=list(releases),
    )
    envelope = sign_statement(statement, signer)
    # Storing is only useful when the trust data accepts the signer: verify before storing.
    verify_attestation(envelope, source="<new>", trust=load_trust(options), measured_digest=digest, now=now)
    store = AttestationStore(layout.attestations)
    with store.locked():  # no other process's change between the store, the removals and the index
        stored = store.add(envelope)  # first: a failure here leaves the earlier qualification in place
        superseded = supersede_qualifications(store, digest, adapter, keep=stored, runtime=runtime)
    result = QualificationResult(
        fixture=fixture.name,
        adapter=adapter,
        status=status,
        fixture_digest=digest,
        candidate_commit=commit,
        attestation=stored,
        log=log_path,
        log_sha256=log_sha,
        superseded=superseded,
        provenance=tuple((log.get("provenance") or {}).get("attestations") or ()),
    )
    if status != "passed":
        failing = [c for c in (MAPPING_CHECKS if "mapping" in log else CHECKS) if not checks.get(c)]
        raise QualificationFailed(
            "evidence.qualify.failed",
            f"{adapter} on {fixture.name}: {status}; failing checks: {', '.join(failing)}",
            evidence=result.to_json(),
        )
    return result


def qualify_all(
    repo: Path | RepoLayout,
    *,
    key: Path | str | None = None,
    options: EngineOptions | None = None,
    allow_dirty: bool = False,
    now: datetime | None = None,
) -> list[dict[str, Any]]:
    """Qualify every fixture that has an adapter; a format without a runtime yet is reported as skipped."""
    layout = as_layout(repo)
    dirty = dirty_paths(layout.root, exclude=layout.evidence_paths)
    if dirty and not allow_dirty:
        raise EvidenceError(
            "evidence.qualify.dirty_tree",
            f"the work tree has {len(dirty)} uncommitted change(s); evidence must name exact code",
            evidence={"paths": dirty[:50]},
        )
    results: list[dict[str, Any]] = []
    for fixture, adapter in qualifiable(layout):
        try:
            r = qualify(layout, fixture, adapter, key=key, options=options, allow_dirty=True, now=now)
            results.append(r.to_json())
        except EvidenceError as e:
            results.append(
                {"fixture": fixture.name, "adapter": adapter, "status": "skipped", "reason": f"[{e.code}] {e.message}"}
            )
        except (InputRejected, PolicyDenied, VerificationError) as e:
            # Inspection or policy refuses this fixture today (e.g. no consolidation runtime for its
            # layout yet): nothing was run or signed; the matrix keeps the adapter unqualified.
            results.append(
                {"fixture": fixture.name, "adapter": adapter, "status": "skipped", "reason": f"[{e.code}] {e.message}"}
            )
        except QualificationFailed as e:
            results.append({**e.evidence, "reason": e.message})
    return results


__all__ = ["CHECKS", "MAPPING_CHECKS", "QualificationResult", "qualify", "qualify_all"]
