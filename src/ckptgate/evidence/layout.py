"""Where a repository keeps its evidence: the attestation store, the support matrix, the generated
gate, the fixtures, and the policy data (gates, freshness) the evidence commands read.

One frozen :class:`RepoLayout` is built from the repository's configuration (``attestations``,
``matrix``, ``fixtures``, ``policies``, ``policy_data``; see :mod:`ckptgate.config`) and passed to
``qualify``, ``matrix build``, ``check`` and ``attest provenance``.  Without a configuration it is
ckptgate's own layout (:meth:`RepoLayout.default`).  Every path is absolute and inside ``root``,
the top of the git work tree, which is what git and the stored statements' locations are relative to.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptgate._json import loads_or_none
from ckptgate._resources import default_policy_dir
from ckptgate.errors import EngineUnavailable

if TYPE_CHECKING:
    from ckptgate.config import Config
    from ckptgate.policydata import PolicyData

DEFAULT_ATTESTATIONS = Path("attestations")
DEFAULT_MATRIX = Path("matrix")
DEFAULT_FIXTURES = Path("tests") / "fixtures" / "data"
DEFAULT_POLICIES = Path("policies")
#: The generated gate inside a policy directory (``data.ckptgate.config.qualified``).
QUALIFIED_IN_BUNDLE = "ckptgate/config/qualified/data.json"


@dataclass(frozen=True, slots=True, kw_only=True)
class RepoLayout:
    """The evidence locations of one repository (absolute paths; ``policies`` ``None``: the bundled ones)."""

    root: Path
    attestations: Path
    matrix: Path
    fixtures: Path
    policies: Path | None = None
    policy_data: PolicyData | None = None

    @classmethod
    def default(cls, root: Path) -> RepoLayout:
        """ckptgate's own layout under ``root``: ``attestations/``, ``matrix/``, ``tests/fixtures/data/``
        and the repository's ``policies/`` (the bundled policies where it has none)."""
        root = root.resolve()
        policies = root / DEFAULT_POLICIES
        return cls(
            root=root,
            attestations=root / DEFAULT_ATTESTATIONS,
            matrix=root / DEFAULT_MATRIX,
            fixtures=root / DEFAULT_FIXTURES,
            policies=policies if policies.is_dir() else None,
        )

    @classmethod
    def from_config(cls, root: Path, config: Config | None) -> RepoLayout:
        """The layout ``config`` names (its unset keys: the defaults, relative to the configuration's
        directory); without a configuration, :meth:`default`."""
        if config is None:
            return cls.default(root)
        base = config.root.resolve()
        return cls(
            root=root.resolve(),
            attestations=(config.attestations or base / DEFAULT_ATTESTATIONS).resolve(),
            matrix=(config.matrix or base / DEFAULT_MATRIX).resolve(),
            fixtures=(config.fixtures or base / DEFAULT_FIXTURES).resolve(),
            policies=None if config.policies is None else config.policies.resolve(),
            policy_data=config.policy_data,
        )

    @property
    def evidence_dir(self) -> Path:
        """Where qualification result logs are retained: ``<attestations>/evidence``."""
        return self.attestations / "evidence"

    def rel(self, p: Path) -> str:
        """``p`` relative to :attr:`root`, POSIX-style (``p`` itself when it is outside)."""
        try:
            return p.resolve().relative_to(self.root).as_posix()
        except ValueError:
            return str(p)

    @property
    def gate_file(self) -> Path | None:
        """The generated gate (``data.ckptgate.config.qualified``) of the repository's own policies;
        ``None`` when the layout uses the bundled policies (their gate is ckptgate's own)."""
        return None if self.policies is None else self.policies / QUALIFIED_IN_BUNDLE

    @property
    def evidence_paths(self) -> tuple[str, ...]:
        """The store, the matrix and the generated gate relative to :attr:`root`: evidence, not
        code, so they never move the candidate commit nor make the tree dirty.  (The gate file is
        listed only when it lies inside the repository.)"""
        paths = [self.attestations, self.matrix]
        gate = self.gate_file
        if gate is not None and gate.resolve().is_relative_to(self.root):
            paths.append(gate)
        return tuple(dict.fromkeys(self.rel(p) for p in paths))

    def policy_json(self, bundle_path: str) -> dict[str, Any] | None:
        """A data document of the policies (``ckptgate/config/gates/data.json``), with the
        configuration's policy-data overlay merged over it; ``None`` when it cannot be read."""
        policies = self.policies
        if policies is None:
            try:
                policies = default_policy_dir()
            except EngineUnavailable:
                return None
        try:
            merged = self.policy_data.overlays(policies) if self.policy_data is not None else {}
            raw = merged.get(bundle_path) or (policies / bundle_path).read_bytes()
            doc = loads_or_none(raw)
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None


def as_layout(repo: Path | RepoLayout) -> RepoLayout:
    """``repo`` itself when it is a layout, else ckptgate's own layout under the directory ``repo``."""
    return repo if isinstance(repo, RepoLayout) else RepoLayout.default(repo)


__all__ = [
    "DEFAULT_ATTESTATIONS",
    "DEFAULT_FIXTURES",
    "DEFAULT_MATRIX",
    "DEFAULT_POLICIES",
    "QUALIFIED_IN_BUNDLE",
    "RepoLayout",
    "as_layout",
]
