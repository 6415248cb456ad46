"""The candidate commit that evidence is bound to, and whether the work tree is clean.

Definition: start at ``HEAD`` and walk first-parent ancestors while each commit's tree, with the
top-level ``attestations/`` and ``matrix/`` entries and the generated gate
``policies/ckptgate/config/qualified/data.json`` removed (or the configured store, matrix and gate,
at any depth: :attr:`ckptgate.evidence.layout.RepoLayout.evidence_paths`), equals HEAD's tree with
those removed.
The candidate is the *oldest* such commit.  So a commit that only adds attestations, a
regenerated matrix or a regenerated gate never names itself, and any other change moves the candidate to ``HEAD``.
Register claim rule 3: a supported row needs retained evidence at the exact candidate commit.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from ckptgate.evidence.errors import GitError

EVIDENCE_PATHS: tuple[str, ...] = ("attestations", "matrix", "policies/ckptgate/config/qualified/data.json")
"""Paths that hold evidence, not code (the store, the matrix and the gate generated from the store):
they never move the candidate commit."""

_GIT_TIMEOUT_S = 60


def git(repo: Path, *args: str, check: bool = True) -> str:
    """Run ``git -C repo args`` and return stdout; a failure raises :class:`GitError`."""
    try:
        proc = subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=_GIT_TIMEOUT_S, check=False
        )
    except FileNotFoundError:
        raise GitError("evidence.git.missing", "git is not installed or not on PATH") from None
    except subprocess.TimeoutExpired:
        raise GitError("evidence.git.timeout", f"git {args[0]} did not finish in {_GIT_TIMEOUT_S} s") from None
    if check and proc.returncode != 0:
        raise GitError(
            "evidence.git.failed",
            f"git {' '.join(args)} failed: {proc.stderr.strip()[:500]}",
            evidence={"args": list(args), "returncode": proc.returncode},
        )
    return proc.stdout


def repo_root(start: Path | None = None) -> Path:
    """The top of the git work tree containing ``start`` (default: the current directory)."""
    out = git(start or Path.cwd(), "rev-parse", "--show-toplevel")
    return Path(out.strip())


def _excluded(path: str, exclude: Sequence[str]) -> bool:
    return any(path == e or path.startswith(e + "/") for e in exclude)


def _filtered_tree(repo: Path, commit: str, exclude: Sequence[str]) -> tuple[str, ...]:
    """The top-level tree entries of ``commit`` (mode, type, object, name) minus ``exclude``.

    An excluded path below the top level (a configured ``evidence/att``) makes it the recursive
    listing of every file instead, minus the files under ``exclude``."""
    nested = any("/" in e for e in exclude)
    out = git(repo, "ls-tree", "-z", "--full-tree", *(["-r"] if nested else []), commit)
    keep = []
    for line in out.split("\0"):
        if not line:
            continue
        _meta, _, name = line.partition("\t")
        if not _excluded(name, exclude):
            keep.append(line)
    return tuple(sorted(keep))


def candidate_commit(repo: Path, *, exclude: Sequence[str] = EVIDENCE_PATHS) -> str:
    """The oldest first-parent ancestor of HEAD whose tree (minus ``exclude``) equals HEAD's."""
    head = git(repo, "rev-parse", "--verify", "HEAD^{commit}").strip()
    want = _filtered_tree(repo, head, exclude)
    candidate = head
    for commit in git(repo, "rev-list", "--first-parent", head).split()[1:]:
        if _filtered_tree(repo, commit, exclude) != want:
            break
        candidate = commit
    return candidate


def head_commit(repo: Path) -> str:
    return git(repo, "rev-parse", "--verify", "HEAD^{commit}").strip()


def commit_time(repo: Path, commit: str) -> datetime:
    """The committer time of ``commit`` (UTC): a deterministic 'now' for evidence evaluated at it."""
    ts = git(repo, "show", "-s", "--format=%ct", commit).strip()
    return datetime.fromtimestamp(int(ts), tz=UTC)


def dirty_paths(repo: Path, *, exclude: Sequence[str] = ()) -> list[str]:
    """Modified, staged, deleted or untracked (not git-ignored) paths, minus those under ``exclude``."""
    out = git(repo, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--ignore-submodules=none")
    paths: list[str] = []
    records = out.split("\0")
    i = 0
    while i < len(records):
        rec = records[i]
        i += 1
        if not rec:
            continue
        status, path = rec[:2], rec[3:]
        if status[0] in "RC":  # a rename/copy is followed by its source path
            i += 1
        if _excluded(path.rstrip("/"), exclude):
            continue
        paths.append(path)
    return sorted(paths)


def tree_is_clean(repo: Path, *, exclude: Sequence[str] = ()) -> bool:
    """True when no tracked file is modified and no untracked, non-ignored file exists (outside ``exclude``)."""
    return not dirty_paths(repo, exclude=exclude)


__all__ = [
    "EVIDENCE_PATHS",
    "candidate_commit",
    "commit_time",
    "dirty_paths",
    "git",
    "head_commit",
    "repo_root",
    "tree_is_clean",
]
