"""``attest_checkpoint``: measure a checkpoint exactly as intake does, write its training provenance and sign it.

The same walk, digest and format detection as ``ckptgate intake`` (:class:`~ckptgate.inspect.SafeTree`,
:func:`~ckptgate.inspect.inspect_open_tree`, :func:`~ckptgate.digest.fixture_digest`), so the statement's
subjects and fixture digest are the ones intake will measure.  The topology is measured from the layout
where the format records it, and a declared value that contradicts it is refused.  Producer versions
come from the running environment, then the checkpoint's own records, then flags (each later source
wins).  The envelope is written beside the checkpoint, never inside it.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import socket
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ckptgate.consolidate.hf.source import read_hf_config
from ckptgate.digest import FixtureDigest, fixture_digest
from ckptgate.errors import InputRejected, UsageError, VerificationError
from ckptgate.inspect import Inspection, SafeTree, Severity, inspect_open_tree
from ckptgate.inspect.findings import Finding
from ckptgate.inspect.runs import ENVELOPE_SUFFIX
from ckptgate.inspect.topology import TOPOLOGY_FIELDS, contradictions, empty_paths, measured_topology, rank_state_ranks
from ckptgate.producer.certificate import check_certificate, sign_with_certificate
from ckptgate.producer.environment import checkpoint_records, code_ref, environment_producers, invocation_id
from ckptgate.producer.keyless import SIGSTORE_SUFFIX, check_identity_token, load_trust_config, sign_keyless
from ckptgate.producer.oms import OMS_SUFFIX, check_oms_signing, sign_oms
from ckptgate.userfiles import check_output_file, write_output_file
from ckptgate.verify.declared import FSDP_MODES, MAX_DEGREE, MAX_STEP, DeclaredValueError, Topology, check_step
from ckptgate.verify.dsse import KeySigner, sign_statement
from ckptgate.verify.statement import schema_errors
from ckptgate.verify.training import BaseModel, CodeRef, Producer, training_statement

__all__ = [
    "ENVELOPE_SUFFIX",
    "AttestRequest",
    "Attested",
    "attest_checkpoint",
    "checked_declared",
    "default_builder_id",
    "parse_topology",
]


BUILDER_ENV = "CKPTGATE_BUILDER_ID"

_INT_FIELDS = frozenset(TOPOLOGY_FIELDS) - {"fsdp_mode"}
_STEP_DIR = re.compile(r"^(?:checkpoint-|global_step|iter_0*)([0-9]{1,18})$")
_DTYPES = {
    "f64": "float64",
    "f32": "float32",
    "f16": "float16",
    "bf16": "bfloat16",
    "float": "float32",
    "half": "float16",
    "double": "float64",
}


def default_builder_id() -> str:
    """``$CKPTGATE_BUILDER_ID``, else ``local://<host>``: name your CI builder with ``--builder-id``."""
    return os.environ.get(BUILDER_ENV) or f"local://{socket.gethostname()}"


def parse_topology(items: Mapping[str, str]) -> dict[str, Any]:
    """``--topology k=v`` values, typed and validated (:class:`~ckptgate.verify.declared.Topology`): the
    degrees and ``zero_stage`` are integers, ``fsdp_mode`` a name."""
    out: dict[str, Any] = {}
    for k, v in items.items():
        if k not in TOPOLOGY_FIELDS:
            raise UsageError(
                "usage.topology.field",
                f"--topology {k}={v}: {k!r} is not a topology field",
                evidence={"field": k, "fields": list(TOPOLOGY_FIELDS)},
                advice=f"Use one of {', '.join(TOPOLOGY_FIELDS)}.",
            )
        if k in _INT_FIELDS:
            if not v.isascii() or not v.isdigit() or len(v) > 18:
                raise UsageError(
                    "usage.topology.value",
                    f"--topology {k}={v}: {k} is a whole number from 0 to {MAX_DEGREE}",
                    evidence={"field": k, "value": v},
                    advice=f"Give a whole number, such as --topology {k}=2.",
                )
            out[k] = int(v)
        else:
            out[k] = v
    return checked_declared(out, None, source="--topology")[0]


def checked_declared(
    topology: Mapping[str, Any], step: Any, *, source: str = "topology"
) -> tuple[dict[str, Any], int | None]:
    """A producer's declared topology and step, refused (``usage.topology.value``, ``usage.step.value``)
    where they cannot be right, before anything is measured or signed: the statement's check would refuse
    the same values at the end (:mod:`ckptgate.verify.declared`)."""
    shown = ", ".join(f"{k}={v!r}" for k, v in topology.items()) or "none"
    try:
        declared = Topology.from_mapping(topology).to_json()
    except DeclaredValueError as e:
        raise UsageError(
            "usage.topology.value",
            f"the declared {source} ({shown}) cannot be right: {e.message}; nothing was signed",
            evidence={"field": e.field, "topology": {str(k): repr(v) for k, v in topology.items()}},
            advice=f"Declare the topology the job ran with ({source} {e.field}): whole-number degrees from 1 to "
            f"{MAX_DEGREE} that divide world_size, tp*pp*cp*dp equal to world_size, zero_stage 0-3, "
            f"fsdp_mode one of {', '.join(FSDP_MODES)}; or leave the field out to have it measured.",
        ) from None
    try:
        return declared, check_step(step)
    except DeclaredValueError as e:
        raise UsageError(
            "usage.step.value",
            f"the declared step {step!r} cannot be right: {e.message}; nothing was signed",
            evidence={"step": repr(step)},
            advice=f"Give the training step as a whole number from 0 to {MAX_STEP} (--step N, or step=N in the "
            f"hook), not {step!r}; or leave it out to have it read from the folder name.",
        ) from None


@dataclass(frozen=True, slots=True, kw_only=True)
class AttestRequest:
    """What a producer asks to attest; everything not given is measured or read from the environment."""

    src: Path
    key: Path | None = None
    """The signing key (PEM); ``None`` only for a dry run."""
    out: Path | None = None
    """Where the envelope goes (default: ``<src>.intoto.dsse.json`` beside ``src``)."""
    builder_id: str | None = None
    producers: Mapping[str, str] = field(default_factory=dict)
    """``--producer NAME=VERSION``: overrides what the environment and the checkpoint say."""
    topology: Mapping[str, Any] = field(default_factory=dict)
    """Declared topology; a value the layout contradicts is refused."""
    environment: bool = True
    """Read producer versions from the running environment (importlib.metadata): true inside the job."""
    dtype: str | None = None
    step: int | None = None
    training_config: Mapping[str, Any] | None = None
    base_model: BaseModel | None = None
    code: CodeRef | None = None
    """The training code; default: git in ``code_dir``."""
    code_dir: Path | None = None
    started: datetime | None = None
    invocation: str | None = None
    dry_run: bool = False
    format: str = "intoto"
    """``intoto``: the training provenance (DSSE); ``oms``: an OpenSSF Model Signing bundle over the same files."""
    identity_token: str | None = None
    """Sign keyless (Sigstore) with this OIDC token instead of ``key``: the training provenance in a Sigstore
    bundle, ``<src>.sigstore.json`` by default."""
    sigstore_trust_config: Path | None = None
    """The Sigstore client trust config (trust root, Fulcio and Rekor URLs); default: the public-good instance."""
    certificate: Path | None = None
    """With ``key``: the X.509 signing certificate (PEM) of ``key``.  The training provenance is then written in
    a Sigstore bundle v0.3 carrying that certificate, ``<src>.sigstore.json`` by default
    (:mod:`ckptgate.producer.certificate`); with ``format="oms"``, model_signing's certificate method.  Intake
    verifies either with ``--certificate-chain``."""
    certificate_chain: tuple[Path, ...] = ()
    """The CA certificates of ``certificate``: with ``format="oms"``, put in the bundle (required); otherwise the
    certificate is checked against them before signing, and the bundle carries the certificate alone."""
    hf_config: Path | None = None
    """The Hugging Face config (``config.json`` or its directory) the job trained against: read as intake
    ``--hf-config`` reads it, its manifest sha256 recorded as ``internalParameters.hf_config_manifest_sha256``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Attested:
    """The statement written (and, unless a dry run, the envelope and where it went)."""

    statement: dict[str, Any] = field(repr=False)
    digest: FixtureDigest = field(repr=False)
    format: str
    measured_topology: dict[str, list[Any]]
    envelope: bytes | None = field(default=None, repr=False)
    path: Path | None = None


INCOMPLETE_FINDINGS = frozenset(
    {
        "dcp.chunks_incomplete",
        "dcp.item_out_of_range",
        "dcp.metadata_unreadable",
        "dcp.metadata_unresolved",
        "dcp.storage_file_missing",
        "deepspeed.model_states_missing",
        "deepspeed.ranks_incomplete",
        "deepspeed.tag_missing",
        "index.missing_shard",
        "index.shard_not_safetensors",
        "index.tensor_missing",
        "index.total_size",
        "input.safetensors.header_beyond_file",
        "input.safetensors.offsets_beyond_file",
        "input.safetensors.too_small",
        "megatron.common_missing",
        "peft.weights_missing",
        "pickle.incomplete",
        "pickle.no_stop",
        "torch.storage_missing",
        "torch.storage_size_mismatch",
        "torch.tensor_out_of_bounds",
        "zip.eocd_missing",
        "zip.truncated",
    }
)
"""Error findings that say the checkpoint is not all there (a rank's files missing, a file cut short, a
save still being written): the statement would vouch for a checkpoint no one wrote, so nothing is signed."""


def _findings_text(findings: list[Finding]) -> str:
    return "; ".join(f"{f.path or '.'}: {f.message} ({f.code})" for f in findings[:3]) + (
        f"; and {len(findings) - 3} more" if len(findings) > 3 else ""
    )


def _check_whole(src: Path, tree: SafeTree, inspection: Inspection) -> None:
    """Refuse a tree the statement could not cover: anything the walk refuses (a symlink, FIFO, device or
    hard link is not hashed, so no subject would name it), a layout that is not there in full, or one that
    is no recognised format (a DCP save before its ``.metadata``, a file still being written)."""
    walk = [f for f in tree.findings if f.severity == Severity.ERROR]
    if walk:
        raise InputRejected(
            "input.walk.not_clean",
            f"{src}: the walk found what intake refuses, so it cannot be attested: {_findings_text(walk)}",
            evidence={"findings": [f.to_json() for f in walk]},
            advice="Run `ckptgate inspect DIR` to see every finding; write only regular files into the "
            "checkpoint (no symlink, FIFO, device or hard link), then attest again.",
        )
    missing = [f for f in inspection.findings if f.severity == Severity.ERROR and f.code in INCOMPLETE_FINDINGS]
    if missing:
        raise InputRejected(
            "input.attest.incomplete",
            f"{src}: the checkpoint is not all there, so it cannot be attested: {_findings_text(missing)}",
            evidence={"findings": [f.to_json() for f in missing], "format": inspection.format},
            advice=f"Attest {src} after every rank has finished writing (the hooks in ckptgate.hooks wait for "
            "every rank); on several nodes, attest where every rank's files are visible.",
        )
    if inspection.format == "unknown":
        raise InputRejected(
            "input.attest.format_unknown",
            f"{src}: no checkpoint format ckptgate recognises (a save still being written, such as a "
            "torch.distributed.checkpoint folder before its .metadata, or not a checkpoint), so it cannot be "
            "attested",
            evidence={"files": [e.path for e in tree.entries][:20]},
            advice="Attest once the save has returned on every rank; `ckptgate inspect DIR` shows what was found.",
        )


def _check_rank_states(src: Path, files: list[str], measured_world: Any, declared_world: Any) -> None:
    """Every process of a Trainer or Accelerate save writes its RNG state: those of processes ``0..`` the
    highest one present, and ``0..world_size-1`` where the layout measures the world size, must all be there (a
    node's files missing from the folder rank 0 measures).  A declared world size is held against a Trainer's
    ``rng_state_<i>.pth`` (every process writes one when there are several), not against Accelerate's
    ``random_states_<i>.pkl`` (``save_state`` called on the main process only writes one)."""
    ranks = rank_state_ranks(files)
    if not ranks:
        return
    world = ranks[-1] + 1
    if isinstance(measured_world, int) and not isinstance(measured_world, bool):
        world = max(world, measured_world)
    trainer = any(f.startswith("rng_state_") for f in files)
    if trainer and isinstance(declared_world, int) and not isinstance(declared_world, bool):
        world = max(world, declared_world)
    if len(ranks) == world:
        return
    present = set(ranks)
    absent = list(itertools.islice((i for i in range(world) if i not in present), 8))
    raise InputRejected(
        "input.attest.incomplete",
        f"{src}: the checkpoint is not all there, so it cannot be attested: the per-process RNG state of "
        f"{world - len(ranks)} of {world} processes is missing, first {absent} (resume.rank_state_missing)",
        evidence={
            "findings": [{"code": "resume.rank_state_missing", "missing": absent, "present": ranks[:64]}],
            "world_size": world,
        },
        advice=f"Attest {src} after every process has finished writing (the hooks in ckptgate.hooks wait for "
        "every rank); on several nodes, attest where every process's files are visible.",
    )


def _measure(src: Path, declared: Mapping[str, Any]) -> tuple[Inspection, FixtureDigest, dict[str, list[Any]]]:
    """Inspect ``src``, refuse what cannot be attested (before anything is hashed), then hash it."""
    with SafeTree.open(src) as tree:
        inspection = inspect_open_tree(tree)
        _check_whole(src, tree, inspection)
        measured = measured_topology(inspection.format, inspection.layout, empty_paths(inspection.files))
        bad = contradictions(declared, measured)
        if bad:
            raise UsageError(
                "usage.topology.contradicts_layout",
                "the declared topology contradicts what the checkpoint's layout records: "
                + "; ".join(f"{k} declared {v['declared']}, layout {v['measured']}" for k, v in bad.items()),
                evidence={"contradictions": bad, "format": inspection.format},
                advice="Declare the topology the job ran with, or leave that --topology field out: it is measured "
                "from the layout (`ckptgate attest checkpoint SRC --dry-run` shows what was measured).",
            )
        world = measured.get("world_size", [None])
        _check_rank_states(
            src, [e.path for e in tree.entries], world[0] if len(world) == 1 else None, declared.get("world_size")
        )
        digest = fixture_digest(tree)
    return inspection, digest, measured


def _dtypes(x: Any, into: Counter[str]) -> None:
    if isinstance(x, dict):
        for k, v in x.items():
            if k == "dtype" and isinstance(v, str):
                into[v] += 1
            else:
                _dtypes(v, into)
    elif isinstance(x, list):
        for v in x:
            _dtypes(v, into)


def _dtype(layout: Mapping[str, Any]) -> str:
    """The most common tensor dtype the layout records, in torch's lower-case spelling."""
    seen: Counter[str] = Counter()
    _dtypes(dict(layout), seen)
    if not seen:
        return "unknown"
    name = seen.most_common(1)[0][0].lower().removeprefix("torch.")
    name = _DTYPES.get(name, name)
    return re.sub(r"[^a-z0-9_]", "_", name)[:32] or "unknown"


def _step(src: Path) -> int | None:
    """The step ``src``'s own name records, else the one step its step folders (``global_stepN/``) all
    record; ``None`` when they record several (a DeepSpeed save_dir of two saves): never one by listing order."""
    m = _STEP_DIR.match(src.name)
    if m:
        return int(m.group(1))
    with os.scandir(src) as it:
        steps = {int(m.group(1)) for e in it if e.is_dir(follow_symlinks=False) and (m := _STEP_DIR.match(e.name))}
    return steps.pop() if len(steps) == 1 else None


def _producers(request: AttestRequest, fmt: str, files: list[str]) -> tuple[list[Producer], BaseModel | None]:
    by_name: dict[str, Producer] = {}
    if request.environment:
        by_name.update((p.name, p) for p in environment_producers(fmt))
    recorded, base = checkpoint_records(request.src, files)
    by_name.update((p.name, p) for p in recorded)
    by_name.update((n, Producer(name=n, version=v, source="flag")) for n, v in request.producers.items())
    return sorted(by_name.values(), key=lambda p: p.name), base


def _check_out(src: Path, out: Path) -> None:
    s, o = src.resolve(), out.resolve()
    if o == s or s in o.parents:
        raise UsageError(
            "usage.attest.out_inside",
            f"--out {out} lies inside the checkpoint {src}: the envelope would change what it attests",
            advice="Write it beside the checkpoint (the default is <checkpoint>.intoto.dsse.json).",
        )


def _check_method(request: AttestRequest) -> None:
    """One signing method: a key (optionally with its X.509 certificate) or keyless."""
    if request.identity_token is not None and (request.key is not None or request.certificate is not None):
        raise UsageError(
            "usage.attest.signing_method",
            "--identity-token signs keyless (Sigstore): give it without --key and --certificate",
            advice="Pass either --identity-token (keyless) or --key KEY.pem (with --certificate CERT.pem to sign "
            "under a certificate), not both.",
        )
    if request.identity_token is not None and request.format == "oms":
        raise UsageError(
            "usage.attest.signing_method",
            "--identity-token signs the training provenance (--format intoto) only",
            advice="Drop --format oms, or sign the OMS bundle with --key (and --certificate).",
        )
    if request.certificate_chain and request.certificate is None:
        raise UsageError(
            "usage.attest.signing_method",
            "--certificate-chain goes with --certificate: it names the CA certificates of the signing certificate",
            advice="Pass --certificate CERT.pem (the signing certificate of --key) with --certificate-chain CA.pem, "
            "or drop --certificate-chain.",
        )
    if request.format == "oms" and request.certificate is not None and not request.certificate_chain:
        raise UsageError(
            "usage.attest.signing_method",
            "with --format oms, --certificate and --certificate-chain go together: the bundle carries the signing "
            "certificate and the chain up to its CA (model_signing's certificate method needs both)",
            advice="Pass --certificate CERT.pem (the signing certificate of --key) with --certificate-chain CA.pem.",
        )


def attest_checkpoint(request: AttestRequest) -> Attested:
    """Measure ``request.src``, write its training-provenance statement and (unless a dry run) sign it.

    Raises :class:`UsageError`: ``usage.topology.contradicts_layout`` (a declared topology field the layout
    records otherwise), ``usage.statement_invalid`` (the statement fails its schema: every error, with its
    JSON path, in the evidence); the errors of the walk and the signing key otherwise.
    """
    started = request.started or datetime.now(UTC)
    src = Path(request.src)
    _check_method(request)
    declared, step = checked_declared(request.topology, request.step)  # the hooks' values too, not only flags
    keyless = request.identity_token is not None
    in_bundle = keyless or request.certificate is not None  # a Sigstore bundle: keyless, or under a certificate
    suffix = OMS_SUFFIX if request.format == "oms" else SIGSTORE_SUFFIX if in_bundle else ENVELOPE_SUFFIX
    out = request.out or src.parent / (src.name + suffix)
    _check_out(src, out)
    if not request.dry_run:  # before anything is signed or logged (a keyless signature is a public log entry)
        check_output_file(out, what="the envelope", exclusive=True, not_inside=(src,))
    signer = token = config = leaf = None  # every signing input is checked before the hash
    if not request.dry_run and keyless:
        token = check_identity_token(str(request.identity_token))
        config = load_trust_config(request.sigstore_trust_config)
    elif not request.dry_run and request.format != "oms":
        signer = KeySigner.from_pem(request.key)
        if request.certificate is not None:
            leaf = check_certificate(signer, request.certificate, request.certificate_chain, datetime.now(UTC))
    elif not request.dry_run:  # --format oms: the same checks sign_oms makes, before hours of hashing
        if request.key is None:
            raise UsageError(
                "usage.signing_key_missing",
                "no signing key: pass --key",
                advice="Pass --key KEY.pem (an EC key for --format oms).",
            )
        check_oms_signing(Path(request.key), request.certificate, request.certificate_chain)
    hf_sha256 = "sha256:" + read_hf_config(request.hf_config).digest if request.hf_config is not None else None
    inspection, digest, measured = _measure(src, declared)
    topology = {k: v[0] for k, v in measured.items() if len(v) == 1}
    topology.update(declared)
    files = [e.path for e in digest.manifest]
    producers, recorded_base = _producers(request, inspection.format, files)
    code = request.code if request.code is not None else code_ref(request.code_dir)
    kwargs: dict[str, Any] = {
        "digest": digest,
        "fmt": inspection.format,
        "topology": {k: topology[k] for k in TOPOLOGY_FIELDS if k in topology},
        "dtype": request.dtype or _dtype(inspection.layout),
        "step": step if step is not None else _step(src),
        "producers": producers,
        "builder_id": request.builder_id or default_builder_id(),
        "invocation_id": request.invocation or invocation_id(),
        "started": started,
        "finished": datetime.now(UTC),
        "training_config": request.training_config,
        "code": code,
        "base_model": request.base_model or recorded_base,
        "hf_config_sha256": hf_sha256,
    }
    try:
        statement = training_statement(**kwargs)
    except VerificationError:
        statement = training_statement(**kwargs, check=False)
        errors = schema_errors(statement)
        raise UsageError(
            "usage.statement_invalid",
            f"the training provenance fails its schema in {len(errors)} place(s), so nothing was signed: "
            + "; ".join(f"{e['path']}: {e['message']}" for e in errors),
            evidence={"errors": errors, "statement": statement},
            advice="Fix the values named (flags such as --producer, --topology, --builder-id), then attest again.",
        ) from None
    result = Attested(statement=statement, digest=digest, format=inspection.format, measured_topology=measured)
    if request.dry_run:
        return result
    if request.format == "oms":
        if request.key is None:
            raise UsageError(
                "usage.signing_key_missing",
                "no signing key: pass --key",
                advice="Pass --key KEY.pem (an EC key for --format oms).",
            )
        sign_oms(src, Path(request.key), out, certificate=request.certificate, chain=request.certificate_chain)
        return Attested(
            statement=statement, digest=digest, format=inspection.format, measured_topology=measured, path=out
        )
    if keyless:
        envelope = sign_keyless(statement, token, config)
    elif leaf is not None:
        assert signer is not None
        envelope = sign_with_certificate(statement, signer, leaf)
    else:
        assert signer is not None
        envelope = sign_statement(statement, signer)
    write_output_file(out, envelope, what="the envelope", exclusive=True, not_inside=(src,))
    return Attested(
        statement=statement,
        digest=digest,
        format=inspection.format,
        measured_topology=measured,
        envelope=envelope,
        path=out,
    )


def statement_json(statement: Mapping[str, Any]) -> str:
    """The statement as the dry run prints it."""
    return json.dumps(statement, indent=2, sort_keys=True)
