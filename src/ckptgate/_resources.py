"""Where ckptgate's own files are: the policies, their data and schemas, and the pinned tools.

Two layouts are supported.  An installed wheel carries the repository's ``policies/`` tree as
package data, ``ckptgate/_policies`` (``[tool.hatch.build.targets.wheel.force-include]`` in
``pyproject.toml``), found through :mod:`importlib.resources`.  A development clone runs from
``src/`` with the top-level ``policies/`` and the pinned ``.tools/bin`` beside it.  The packaged
copy is preferred when it exists, so an installed ckptgate never reads a tree it merely sits near.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from ckptgate.errors import EngineUnavailable

PACKAGED_POLICIES = "_policies"
#: The OPA release ``pins.toml`` pins.  Supported: it and every later release of the same major version.
OPA_PINNED = (1, 22, 3)
OPA_SUPPORTED = f"{OPA_PINNED[0]}.x from {'.'.join(map(str, OPA_PINNED))}"
#: The Regal release ``pins.toml`` pins; ``check`` runs Regal (and ``opa fmt``) only at the pinned version.
REGAL_PINNED = (0, 38, 1)


@dataclass(frozen=True, slots=True)
class GoTool:
    """A Go tool ckptgate pins: its module, version, and the package whose ``Version`` the build sets."""

    name: str
    module: str
    version: tuple[int, int, int]
    version_package: str

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version))

    @property
    def spec(self) -> str:
        """``module@vX.Y.Z``, as ``pins.toml``'s ``[tools]`` writes it."""
        return f"{self.module}@v{self.version_text}"


#: The pinned Go tools (``pins.toml``'s ``[tools]``; a test keeps the two equal).
GO_TOOLS = {
    "opa": GoTool("opa", "github.com/open-policy-agent/opa", OPA_PINNED, "github.com/open-policy-agent/opa/v1/version"),
    "regal": GoTool(
        "regal", "github.com/open-policy-agent/regal", REGAL_PINNED, "github.com/open-policy-agent/regal/pkg/version"
    ),
}


def source_root() -> Path | None:
    """The development clone this package runs from (``src/ckptgate`` inside it), else ``None``."""
    root = Path(__file__).resolve().parents[2]
    if (root / "pyproject.toml").is_file() and (root / "policies").is_dir() and (root / "src" / "ckptgate").is_dir():
        return root
    return None


def packaged_policies() -> Path | None:
    """The ``policies/`` tree the installed package carries, else ``None`` (a clone carries none)."""
    p = resources.files("ckptgate").joinpath(PACKAGED_POLICIES)
    return p if isinstance(p, Path) and p.is_dir() else None


def policies_dir() -> Path | None:
    """The package's policies: the packaged copy, else the clone's ``policies/``, else ``None``."""
    packaged = packaged_policies()
    if packaged is not None:
        return packaged
    root = source_root()
    return root / "policies" if root is not None else None


def default_policy_dir() -> Path:
    """``$CKPTGATE_POLICIES``, else the policies the installed package carries (the clone's
    ``policies/`` when running from a development clone)."""
    explicit = os.environ.get("CKPTGATE_POLICIES")
    path = Path(explicit) if explicit else policies_dir()
    if path is None:
        raise EngineUnavailable(
            "engine.policies.missing",
            "this installation of ckptgate carries no policies",
            advice="Reinstall ckptgate from its wheel, or name a policy directory with "
            "--policies or CKPTGATE_POLICIES.",
        )
    if not os.path.isdir(path):  # False for any failure, a name too long included (Path.is_dir raises on that)
        raise EngineUnavailable("engine.policies.missing", f"policy directory {path} does not exist")
    return path


def clone_tool(name: str) -> Path | None:
    """The development clone's pinned ``.tools/bin/NAME``, when there is a clone and the tool is in it."""
    root = source_root()
    if root is None:
        return None
    p = root / ".tools" / "bin" / name
    return p if p.exists() else None
