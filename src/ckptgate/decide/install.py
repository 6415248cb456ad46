"""``ckptgate engine install``: the pinned OPA (and Regal) built with ``go install``.

Go fetches the sources from the Go module proxy (``GOPROXY``) and checks them against the checksum
database; ckptgate itself downloads nothing.  As ``scripts/bootstrap.py`` does, each tool is built
inside a throwaway module that requires exactly the pinned version, and the build stamps that
version into the binary (``-ldflags -X <version package>.Version=...``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptgate._resources import GO_TOOLS, OPA_SUPPORTED, GoTool
from ckptgate.decide.bundle import parse_opa_version
from ckptgate.errors import EngineUnavailable, UsageError

INSTALL_TIMEOUT_S = 1800
NO_GO_ADVICE = (
    "Install Go (https://go.dev/dl/) and run `ckptgate engine install` again; or name an OPA binary "
    f"(version {OPA_SUPPORTED}) with --opa-binary PATH or CKPTGATE_OPA=PATH, or put `opa` on PATH; "
    "or use a running OPA server with --opa-url URL."
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Installed:
    """One pinned tool in the install directory."""

    name: str
    spec: str
    path: Path
    #: ``False`` when the pinned version was already there and nothing was built.
    built: bool

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "spec": self.spec, "path": str(self.path), "built": self.built}


def default_install_dir() -> Path:
    """``$XDG_DATA_HOME/ckptgate/bin`` (an absolute ``XDG_DATA_HOME`` only), else ``~/.local/share/ckptgate/bin``."""
    data = os.environ.get("XDG_DATA_HOME")
    base = Path(data) if data and os.path.isabs(data) else Path.home() / ".local" / "share"
    return base / "ckptgate" / "bin"


def reported_version(path: Path) -> tuple[int, int, int] | None:
    """The ``Version:`` that ``PATH version`` prints, else ``None`` (absent, not runnable, no version)."""
    try:
        proc = subprocess.run(
            [str(path), "version"], capture_output=True, text=True, timeout=30, check=False, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_opa_version(proc.stdout) if proc.returncode == 0 else None


def install(directory: Path, *, regal: bool = False) -> list[Installed]:
    """``go install`` the pinned OPA (and Regal) into ``directory``, skipping a tool already there at
    the pinned version.  No ``go`` on PATH is ``usage.engine.no_go``; a failed build, or a binary that
    does not report the pinned version, is ``engine.install.failed``."""
    names = ("opa", "regal") if regal else ("opa",)
    tools = [GO_TOOLS[n] for n in names]
    pending = [t for t in tools if reported_version(directory / t.name) != t.version]
    go = shutil.which("go") if pending else None
    if pending and go is None:
        raise UsageError(
            "usage.engine.no_go",
            "`ckptgate engine install` needs Go (`go` on PATH) to build " + ", ".join(t.spec for t in pending),
            evidence={"tools": [t.spec for t in pending]},
            advice=NO_GO_ADVICE,
        )
    if directory.exists() and not directory.is_dir():
        raise UsageError(
            "usage.engine.dir",
            f"{directory} exists and is not a directory",
            advice=f"Name a directory with --dir (or leave it out for the default), not {directory}.",
        )
    directory.mkdir(parents=True, exist_ok=True)
    done = []
    for tool in tools:
        built = tool in pending
        if built:
            assert go is not None
            _go_install(go, tool, directory)
        done.append(Installed(name=tool.name, spec=tool.spec, path=directory / tool.name, built=built))
    return done


def _go_install(go: str, tool: GoTool, directory: Path) -> None:
    with tempfile.TemporaryDirectory(prefix=f"ckptgate-{tool.name}-") as mod:
        Path(mod, "go.mod").write_text(
            f"module ckptgate.local/tools/{tool.name}\n\ngo 1.24\n\nrequire {tool.module} v{tool.version_text}\n"
        )
        cmd = [go, "install", f"-ldflags=-X {tool.version_package}.Version={tool.version_text}", tool.module]
        env = {**os.environ, "GOBIN": str(directory.resolve()), "GOFLAGS": "-mod=mod"}
        try:
            proc = subprocess.run(
                cmd, cwd=mod, env=env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise EngineUnavailable(
                "engine.install.failed",
                f"`go install {tool.spec}` did not run: {e}",
                evidence={"tool": tool.spec},
                advice=NO_GO_ADVICE,
            ) from None
    if proc.returncode != 0:
        raise EngineUnavailable(
            "engine.install.failed",
            f"`go install {tool.spec}` exited {proc.returncode}",
            evidence={"tool": tool.spec, "output": (proc.stdout + proc.stderr)[-4000:]},
            advice="Check that Go can reach its module proxy (GOPROXY); " + NO_GO_ADVICE,
        )
    found = reported_version(directory / tool.name)
    if found != tool.version:
        shown = ".".join(map(str, found)) if found else "no version"
        raise EngineUnavailable(
            "engine.install.failed",
            f"{directory / tool.name} reports {shown}, not the pinned {tool.version_text}",
            evidence={"tool": tool.spec, "path": str(directory / tool.name), "version": shown},
            advice=NO_GO_ADVICE,
        )
