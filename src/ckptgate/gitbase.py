"""``--base REV``: the configuration and the decision inputs it names, read from git's object store.

In pre-merge CI the pull request controls the work tree, so its own ``ckptgate.toml``, overlay,
extra Rego, trust data and policy tree must not decide about it.  :func:`materialize` finds the
configuration that discovery would find, but in the commit ``REV`` names (immutable objects, never
the work tree), and writes it with the files it names into a private directory, from which the
command then reads them.  Each file is named ``REV:path`` in the decision's inputs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from ckptgate.config import CONFIG_FILE, PYPROJECT, Config, from_table, read_table
from ckptgate.errors import ConfigError, UsageError

__all__ = ["BaseConfig", "materialize"]

#: The keys whose files shape a decision, and so are read at the base.
DECISION_KEYS = ("trust", "policy_data", "extra_rego", "policies")
_MAX_BYTES = 64 << 20


@dataclass(frozen=True, slots=True, kw_only=True)
class BaseConfig:
    """The configuration at ``rev`` (``None`` when the commit has none), where it was read from,
    and what a reviewer sees as each file's name (``REV:path``)."""

    rev: str
    commit: str
    config: Config | None
    #: the configuration's path inside the repository, as ``REV:path``
    label: str | None
    #: the table as written at the base (settings such as ``widening`` come only from here)
    table: dict[str, object]
    #: the configuration's directory relative to the work tree's root
    directory: PurePosixPath


def _git(args: list[str], cwd: Path, *, what: str) -> bytes:
    try:
        proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise UsageError(
            "usage.base.git",
            f"--base: git could not be run: {e}",
            advice="--base reads the configuration with git: put `git` on PATH, or leave --base out.",
        ) from None
    if proc.returncode != 0:
        raise UsageError(
            "usage.base.git",
            f"--base: {what}: {proc.stderr.decode(errors='replace').strip()[:500]}",
            advice="Name a revision of this repository that git knows, such as origin/main "
            "(in CI, fetch it first: `git fetch origin main`).",
        )
    return proc.stdout


def materialize(rev: str, start: Path, into: Path) -> BaseConfig:
    """The configuration discovery would find from ``start``, read at ``rev``, with the files its
    decision keys name, extracted under ``into`` (a private directory the caller removes)."""
    start = start.absolute()
    top_text = _git(["rev-parse", "--show-toplevel"], start, what="not inside a git work tree").decode().strip()
    top = Path(top_text)
    commit = _git(["rev-parse", "--verify", "--end-of-options", f"{rev}^{{commit}}"], top, what=f"{rev!r} is no commit")
    commit_id = commit.decode().strip()
    here = PurePosixPath(start.resolve().relative_to(top.resolve()).as_posix())
    for d in (here, *here.parents):
        for name in (CONFIG_FILE, PYPROJECT):
            rel = d / name if str(d) != "." else PurePosixPath(name)
            raw = _show(top, commit_id, rel)
            if raw is None:
                continue
            local = into / rel
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_bytes(raw)
            if name == PYPROJECT:
                try:
                    table = read_table(local, raw)
                except ConfigError as e:
                    if e.code == "usage.config.missing":
                        continue
                    raise
            else:
                table = read_table(local, raw)
            directory = rel.parent
            _extract(
                top,
                commit_id,
                [directory / str(table[k]) for k in DECISION_KEYS if isinstance(table.get(k), str)],
                into,
            )
            # only the decision keys are read at the base: the rest (docs, evidence) names the work tree's
            decision = {k: v for k, v in table.items() if k in (*DECISION_KEYS, "widening")}
            config = from_table(decision, root=(into / directory).absolute(), source=local.absolute())
            config = dataclasses.replace(config, sha256="sha256:" + hashlib.sha256(raw).hexdigest())
            return BaseConfig(
                rev=rev, commit=commit_id, config=config, label=f"{rev}:{rel}", table=table, directory=directory
            )
    return BaseConfig(rev=rev, commit=commit_id, config=None, label=None, table={}, directory=here)


def _show(top: Path, commit: str, rel: PurePosixPath) -> bytes | None:
    """The blob at ``commit:rel``, or ``None`` when there is none (or it is no regular file)."""
    if _kind(top, commit, rel) != "blob":
        return None
    raw = _git(["cat-file", "blob", f"{commit}:{rel}"], top, what=f"{rel}")
    if len(raw) > _MAX_BYTES:
        raise UsageError(
            "usage.base.too_large",
            f"--base: {rel} at {commit[:12]} is over {_MAX_BYTES} bytes",
            advice=f"Keep {rel} under {_MAX_BYTES} bytes at the base revision "
            f"(`git show {commit[:12]}:{rel}` shows it).",
        )
    return raw


def _extract(top: Path, commit: str, paths: list[PurePosixPath], into: Path) -> None:
    """``git archive`` of ``paths`` at ``commit``, unpacked under ``into`` with tarfile's data filter
    (no links out of it, no devices, no absolute names); a path missing at the commit is skipped,
    and the configuration's own check then reports it."""
    present = [str(p) for p in paths if _kind(top, commit, p) is not None]
    if not present:
        return
    archive = _git(["archive", "--format=tar", commit, "--", *present], top, what="git archive")
    try:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(into, filter="data")
    except tarfile.TarError as e:  # a link out of the tree, or an absolute one, at the base
        raise ConfigError(
            "usage.base.link",
            f"--base: a file the configuration at {commit[:12]} names cannot be read from git's objects: {e}",
            evidence={"commit": commit, "paths": present},
            advice=f"At {commit[:12]}, make {', '.join(present)} regular files inside the repository (no links "
            "to absolute paths or out of it), or pass another --base REV.",
        ) from None


def _kind(top: Path, commit: str, rel: PurePosixPath) -> str | None:
    """The object type at ``commit:rel`` (``blob``, ``tree``...), or ``None`` when there is none."""
    proc = subprocess.run(
        ["git", "cat-file", "-t", f"{commit}:{rel}"], cwd=top, capture_output=True, timeout=60, check=False
    )
    return proc.stdout.decode().strip() if proc.returncode == 0 else None
