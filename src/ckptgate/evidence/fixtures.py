"""The fixtures catalogue: ``tests/fixtures/data/<name>/`` with ``checkpoint/``,
``expected.safetensors`` and ``meta.json`` (what produced it, with which versions and topology),
and the repository paths evidence is read from and written to."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptgate.evidence.errors import EvidenceError
from ckptgate.evidence.layout import DEFAULT_ATTESTATIONS, DEFAULT_FIXTURES, RepoLayout, as_layout
from ckptgate.inspect.runs import select_checkpoint

#: ckptgate's own layout; a configured repository's is its :class:`~ckptgate.evidence.layout.RepoLayout`.
FIXTURES_DIR = DEFAULT_FIXTURES
STORE_DIR = DEFAULT_ATTESTATIONS
EVIDENCE_DIR = STORE_DIR / "evidence"
DEFAULT_KEY = Path("..") / "shared" / "keys" / "ci-qualification.ed25519.pem"
"""Relative to the repository root; the private key is read, never copied or printed."""
_AXES = ("tp", "pp", "dp", "cp", "ep", "etp")
WRITTEN_BY = "written_by"
"""A fixture's folder of generation records: ``<fixture>/written_by/<name>.json`` is the
``meta.json`` another environment (another producer release) wrote for exactly these bytes,
kept by ``scripts/farm.py`` instead of a second copy (``same_bytes_as`` in a farm lock)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Fixture:
    """One generated fixture: ``checkpoint/``, ``expected.safetensors`` and ``meta.json``."""

    name: str
    root: Path
    meta: Mapping[str, Any] = field(repr=False)
    manifest_file: Path | None = None
    """The ``meta.json`` this view reads: the fixture's own (None), or a generation record's
    (:meth:`written_by`): the same bytes, as another environment recorded them."""

    def __post_init__(self) -> None:
        for need in ("format", "producer", "versions", "topology"):
            if need not in self.meta:
                raise EvidenceError(
                    "evidence.fixture.meta_field",
                    f"fixture {self.name}: meta.json has no {need!r}",
                    evidence={"fixture": self.name, "field": need},
                )
        if not self.checkpoint.is_dir() or not self.expected.is_file():
            raise EvidenceError(
                "evidence.fixture.layout",
                f"fixture {self.name} needs checkpoint/ and expected.safetensors",
                evidence={"fixture": str(self.root)},
            )

    @classmethod
    def load(cls, root: Path, *, manifest: Path | None = None) -> Fixture:
        """The fixture at ``root``; with ``manifest``, its view through that generation record."""
        path = manifest or root / "meta.json"
        try:
            meta = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise EvidenceError(
                "evidence.fixture.meta_unreadable",
                f"cannot read {path}: {e}",
                evidence={"fixture": str(root)},
            ) from None
        if not isinstance(meta, dict):
            raise EvidenceError("evidence.fixture.meta_unreadable", f"{path} is not an object")
        name = root.name if manifest is None else manifest.stem
        return cls(name=name, root=root, meta=meta, manifest_file=manifest)

    @property
    def manifest(self) -> Path:
        """The file :attr:`meta` was read from (``meta.json``, or a generation record)."""
        return self.manifest_file or self.root / "meta.json"

    def written_by(self) -> tuple[Fixture, ...]:
        """The generation records of other environments that wrote exactly these bytes, each as a
        view of this fixture (same ``checkpoint/`` and ground truth) with that environment's
        ``meta.json``: its name, producer versions and command.  Whether a record names exactly
        these bytes is checked where it is vouched for (:mod:`ckptgate.evidence.provenance`)."""
        if self.manifest_file is not None:
            return ()
        folder = self.root / WRITTEN_BY
        if not folder.is_dir():
            return ()
        return tuple(Fixture.load(self.root, manifest=p) for p in sorted(folder.glob("*.json")))

    @property
    def checkpoint(self) -> Path:
        """``checkpoint/``, or the ``checkpoint-N/`` inside it that ``meta.json`` names as
        ``selected_checkpoint`` (a Trainer output directory: the ground truth is for that one)."""
        selected = self.meta.get("selected_checkpoint")
        if isinstance(selected, str) and selected:
            return select_checkpoint(self.root / "checkpoint", selected.removeprefix("checkpoint-"))
        return self.root / "checkpoint"

    def recorded_files(self) -> Any:
        """``meta.json``'s ``checkpoint_files``, relative to :attr:`checkpoint` (for a selected
        ``checkpoint-N/``, its files only, without the folder's name)."""
        recorded = self.meta.get("checkpoint_files")
        sub = self.checkpoint.relative_to(self.root / "checkpoint").as_posix()
        if sub == "." or not isinstance(recorded, dict):
            return recorded
        return {k[len(sub) + 1 :]: v for k, v in recorded.items() if k.startswith(sub + "/")}

    @property
    def expected(self) -> Path:
        return self.root / "expected.safetensors"

    @property
    def expected_kind(self) -> str:
        """What ``expected.safetensors`` holds: ``weights`` (the consolidated state dict a name-preserving
        intake must equal), or ``logits`` (the producer's own forward pass, for a mapping's logits check)."""
        return str(self.meta.get("expected_kind", "weights"))

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
            raise EvidenceError(
                "evidence.fixture.producer_version",
                f"fixture {self.name}: no exact version recorded for producer {package!r}",
                evidence={"fixture": self.name, "producer": call},
            )
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


def list_fixtures(repo: Path | RepoLayout) -> list[Fixture]:
    """The fixtures under the layout's fixtures directory (ckptgate's own for a plain path)."""
    base = as_layout(repo).fixtures
    if not base.is_dir():
        return []
    return [Fixture.load(d) for d in sorted(base.iterdir()) if (d / "meta.json").is_file()]


def find_fixture(repo: Path | RepoLayout, name_or_path: str) -> Fixture:
    p = Path(name_or_path)
    root = p if (p / "meta.json").is_file() else as_layout(repo).fixtures / name_or_path
    if not (root / "meta.json").is_file():
        known = [f.name for f in list_fixtures(repo)]
        raise EvidenceError(
            "evidence.fixture.unknown",
            f"no fixture {name_or_path!r}",
            evidence={"known": known},
            advice=f"Known fixtures: {', '.join(known) or 'none'}.",
        )
    return Fixture.load(root.resolve())


def repo_relative(repo: Path | RepoLayout, p: Path) -> str:
    return as_layout(repo).rel(p)


def resolve_key(repo: Path | RepoLayout, key: Path | str | None) -> Path:
    """``--key``, else ``$CKPTGATE_SIGNING_KEY``, else ``../shared/keys/ci-qualification.ed25519.pem``."""
    root = repo.root if isinstance(repo, RepoLayout) else repo
    chosen = key or os.environ.get("CKPTGATE_SIGNING_KEY") or (root / DEFAULT_KEY)
    p = Path(chosen)
    if not p.is_file():
        raise EvidenceError(
            "evidence.qualify.no_key",
            f"no signing key at {p}",
            advice="Pass --key PEM or set CKPTGATE_SIGNING_KEY; CI uses ../shared/keys/.",
        )
    return p


__all__ = [
    "DEFAULT_KEY",
    "EVIDENCE_DIR",
    "FIXTURES_DIR",
    "STORE_DIR",
    "WRITTEN_BY",
    "Fixture",
    "find_fixture",
    "list_fixtures",
    "repo_relative",
    "resolve_key",
]
