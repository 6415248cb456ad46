"""The Python API for embedding ckptgate: ``inspect``, ``verify`` and ``intake``.

Thin functions over the library, doing what the commands of the same names do.  Engine settings
are an :class:`EngineOptions` (``ckptgate.pipeline``), as the CLI builds them; by default the
embedded OPA with the bundled policies and trust data.  Every failure is a
:class:`ckptgate.errors.Error` carrying the CLI's stable ``code`` and ``exit_code``.  A deny from
:func:`intake` is raised (:class:`PolicyDenied`, :class:`VerificationError` or
:class:`InputRejected`); :func:`verify` returns the decision instead, in its :class:`Report`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptgate.decide.options import EngineOptions
from ckptgate.errors import (
    EngineUnavailable,
    Error,
    ExitCode,
    InputRejected,
    PolicyDenied,
    UsageError,
    VerificationError,
)
from ckptgate.evidence.report import build_report
from ckptgate.inspect import Inspection, SafeTree, inspect_open_tree
from ckptgate.pipeline import IntakeResult
from ckptgate.pipeline import intake as run_intake


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """What :func:`verify` found: the document ``ckptgate verify --json`` prints, with shortcuts."""

    document: dict[str, Any]

    @property
    def allow(self) -> bool:
        """Whether the policy would allow an intake of this checkpoint."""
        return bool(self.document["decision"]["allow"])

    @property
    def reasons(self) -> list[dict[str, Any]]:
        """The decision's reasons (``code``, ``message``, ``evidence``)."""
        return list(self.document["decision"].get("reasons") or [])

    @property
    def digest(self) -> str:
        """The checkpoint's fixture digest (``sha256:...``)."""
        return str(self.document["checkpoint"]["digest"])


def inspect(path: Path | str) -> Inspection:
    """Inspect the checkpoint directory ``path`` by its content, loading nothing; ``clean`` tells
    whether it has no error finding (``ckptgate inspect``)."""
    with SafeTree.open(Path(path)) as tree:
        return inspect_open_tree(tree)


def verify(
    path: Path | str, attestations: Sequence[Path | str] = (), *, options: EngineOptions | None = None
) -> Report:
    """Inspect, digest, verify the ``attestations`` and ask the policy, loading nothing
    (``ckptgate verify``)."""
    return Report(document=build_report(Path(path), [Path(a) for a in attestations], options=options))


def intake(
    src: Path | str,
    dst: Path | str,
    attestations: Sequence[Path | str],
    *,
    options: EngineOptions | None = None,
    max_shard_bytes: int = 2 << 30,
    hf_config: Path | str | None = None,
    workers: int | None = None,
) -> IntakeResult:
    """Take ``src`` in through the gate and publish Hugging Face sharded safetensors at ``dst``,
    only on allow (``ckptgate intake``); raises on deny, publishing nothing.  ``hf_config``
    (``--hf-config``) maps a Megatron checkpoint to the Hugging Face model that config declares.
    ``workers`` (``--workers``): threads that hash and write; by default the cores this process
    may run on.  The published bytes do not depend on it."""
    return run_intake(
        Path(src),
        Path(dst),
        attestations=[Path(a) for a in attestations],
        options=options,
        max_shard_bytes=max_shard_bytes,
        hf_config=Path(hf_config) if hf_config is not None else None,
        workers=workers,
    )


__all__ = [
    "EngineOptions",
    "EngineUnavailable",
    "Error",
    "ExitCode",
    "InputRejected",
    "Inspection",
    "IntakeResult",
    "PolicyDenied",
    "Report",
    "UsageError",
    "VerificationError",
    "inspect",
    "intake",
    "verify",
]
