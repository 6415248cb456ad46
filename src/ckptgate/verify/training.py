"""The training-provenance statement (in-toto Statement v1, SLSA Provenance v1 with the ckptgate training
build type): how a producer writes one, and the facts policy and the reviewer report read from a verified one.

The statement says what a checkpoint is and who produced it; whether ckptgate's adapter is qualified for
that producer version and topology is the gate data's to say (``data.ckptgate.config.gates``), never the
statement's.  A verified signature establishes integrity under a trusted key; it does not make the
checkpoint safe to deserialise [R27].
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ckptgate.digest import FixtureDigest
from ckptgate.verify.statement import (
    SLSA_PROVENANCE_V1,
    STATEMENT_TYPE,
    TRAINING_BUILD_TYPE,
    check_statement,
    field_at,
    iso_utc,
)

__all__ = ["BaseModel", "CodeRef", "Producer", "TrainingFacts", "is_training", "training_statement"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Producer:
    """A library that wrote (part of) the checkpoint, at its exact version."""

    name: str
    version: str
    source: str = "environment"
    """Where the version was read: ``environment`` (importlib.metadata in the job), ``checkpoint`` (the
    checkpoint's own records, such as DeepSpeed's ``ds_version``) or ``flag`` (given on the command line)."""

    def to_dependency(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "uri": f"pkg:pypi/{self.name}@{self.version}",
            "annotations": {"kind": "producer", "version": self.version, "source": self.source},
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class CodeRef:
    """The training code: its repository and the commit checked out."""

    uri: str
    commit: str
    dirty: bool = False

    def to_dependency(self) -> dict[str, Any]:
        return {
            "name": "training-code",
            "uri": self.uri,
            "digest": {"gitCommit": self.commit},
            "annotations": {"kind": "code", "dirty": self.dirty},
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class BaseModel:
    """For an adapter: the model it was trained on (repository, revision and, where known, digest) [R16]."""

    repo: str
    revision: str
    sha256: str | None = None

    def to_dependency(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.repo,
            "uri": self.repo if "://" in self.repo else f"https://huggingface.co/{self.repo}",
            "annotations": {"kind": "base_model", "revision": self.revision},
        }
        if self.sha256:
            out["digest"] = {"sha256": self.sha256.removeprefix("sha256:")}
        return out


def training_statement(
    *,
    digest: FixtureDigest,
    fmt: str,
    topology: Mapping[str, Any],
    dtype: str,
    step: int | None,
    producers: Sequence[Producer],
    builder_id: str,
    invocation_id: str,
    started: datetime,
    finished: datetime,
    training_config: Mapping[str, Any] | None = None,
    code: CodeRef | None = None,
    base_model: BaseModel | None = None,
    hf_config_sha256: str | None = None,
    check: bool = True,
) -> dict[str, Any]:
    """The training-provenance statement over every file of ``digest``'s manifest; checked against its
    schema before it is returned (:class:`~ckptgate.errors.VerificationError` when it does not match;
    ``check=False``: unchecked, for reporting every schema error at once).  ``hf_config_sha256``
    (``sha256:<hex>``): the manifest digest of the Hugging Face config the job declares, which intake
    ``--hf-config`` policy can require to be the declared one."""
    deps = [p.to_dependency() for p in sorted(producers, key=lambda p: p.name)]
    if code is not None:
        deps.append(code.to_dependency())
    if base_model is not None:
        deps.append(base_model.to_dependency())
    statement = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": e.path, "digest": {"sha256": e.sha256}} for e in digest.manifest],
        "predicateType": SLSA_PROVENANCE_V1,
        "predicate": {
            "buildDefinition": {
                "buildType": TRAINING_BUILD_TYPE,
                "externalParameters": {"training_config": dict(training_config or {})},
                "internalParameters": {
                    "topology": dict(topology),
                    "dtype": dtype,
                    "step": step,
                    "format": fmt,
                    "fixture_digest": digest.digest.prefixed(),
                    **({"hf_config_manifest_sha256": hf_config_sha256} if hf_config_sha256 is not None else {}),
                },
                "resolvedDependencies": deps,
            },
            "runDetails": {
                "builder": {"id": builder_id},
                "metadata": {
                    "invocationId": invocation_id,
                    "startedOn": iso_utc(started),
                    "finishedOn": iso_utc(finished),
                },
            },
        },
    }
    if check:
        check_statement(statement)
    return statement


def is_training(statement: Any) -> bool:
    """Whether ``statement`` is SLSA provenance of the ckptgate training build type."""
    return (
        isinstance(statement, dict)
        and statement.get("predicateType") == SLSA_PROVENANCE_V1
        and field_at(statement, "predicate", "buildDefinition", "buildType") == TRAINING_BUILD_TYPE
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainingFacts:
    """What a schema-checked training statement says, flattened for policy and the reviewer report."""

    builder_id: str
    invocation_id: str
    started_on: str
    finished_on: str
    fixture_digest: str
    format: str
    dtype: str
    step: int | None
    topology: dict[str, Any] = field(default_factory=dict)
    producers: tuple[Producer, ...] = ()
    code: CodeRef | None = None
    base_model: BaseModel | None = None
    hf_config_sha256: str | None = None
    """``internalParameters.hf_config_manifest_sha256``: the Hugging Face config the job declares."""

    @classmethod
    def from_statement(cls, statement: Mapping[str, Any]) -> TrainingFacts:
        """From a statement that :func:`~ckptgate.verify.statement.check_statement` accepted."""
        build = statement["predicate"]["buildDefinition"]
        run = statement["predicate"]["runDetails"]
        internal = build["internalParameters"]
        producers, code, base = [], None, None
        for dep in build["resolvedDependencies"]:
            kind = dep["annotations"]["kind"]
            if kind == "producer":
                producers.append(
                    Producer(
                        name=dep["name"], version=dep["annotations"]["version"], source=dep["annotations"]["source"]
                    )
                )
            elif kind == "code":
                code = CodeRef(
                    uri=dep["uri"], commit=dep["digest"]["gitCommit"], dirty=bool(dep["annotations"].get("dirty"))
                )
            else:
                base = BaseModel(
                    repo=dep["name"],
                    revision=dep["annotations"]["revision"],
                    sha256=dep.get("digest", {}).get("sha256"),
                )
        return cls(
            builder_id=run["builder"]["id"],
            invocation_id=run["metadata"]["invocationId"],
            started_on=run["metadata"]["startedOn"],
            finished_on=run["metadata"]["finishedOn"],
            fixture_digest=internal["fixture_digest"],
            format=internal["format"],
            dtype=internal["dtype"],
            step=internal["step"],
            topology=dict(internal["topology"]),
            producers=tuple(producers),
            code=code,
            base_model=base,
            hf_config_sha256=internal.get("hf_config_manifest_sha256"),
        )

    def to_json(self) -> dict[str, Any]:
        """The ``training`` object of an attestation's facts (docs/architecture.md)."""
        return {
            "builder_id": self.builder_id,
            "invocation_id": self.invocation_id,
            "started_on": self.started_on,
            "finished_on": self.finished_on,
            "fixture_digest": self.fixture_digest,
            "format": self.format,
            "dtype": self.dtype,
            "step": self.step,
            "topology": dict(self.topology),
            "producers": [{"name": p.name, "version": p.version, "source": p.source} for p in self.producers],
            "code": None
            if self.code is None
            else {"uri": self.code.uri, "commit": self.code.commit, "dirty": self.code.dirty},
            "base_model": None
            if self.base_model is None
            else {"repo": self.base_model.repo, "revision": self.base_model.revision, "sha256": self.base_model.sha256},
        } | ({"hf_config_sha256": self.hf_config_sha256} if self.hf_config_sha256 is not None else {})

    def lines(self) -> list[tuple[str, str]]:
        """The provenance in plain words, one ``(label, text)`` per line (``attest show``, the report)."""
        topo = ", ".join(f"{k}={v}" for k, v in self.topology.items() if v is not None) or "not recorded"
        out = [
            ("builder", self.builder_id),
            ("invocation", f"{self.invocation_id} ({self.started_on} .. {self.finished_on})"),
            ("checkpoint", f"{self.format}, step {self.step if self.step is not None else '?'}, dtype {self.dtype}"),
            ("fixture", self.fixture_digest),
            ("topology", topo),
            (
                "producers",
                ", ".join(f"{p.name} {p.version} ({p.source})" for p in self.producers) or "none recorded",
            ),
            (
                "code",
                "not recorded"
                if self.code is None
                else f"{self.code.uri} at {self.code.commit}" + (" (uncommitted changes)" if self.code.dirty else ""),
            ),
        ]
        if self.base_model is not None:
            b = self.base_model
            out.append(("base model", f"{b.repo} revision {b.revision}" + (f" sha256:{b.sha256}" if b.sha256 else "")))
        if self.hf_config_sha256 is not None:
            out.append(("hf config", f"manifest {self.hf_config_sha256}"))
        return out
