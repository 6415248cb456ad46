"""A run directory holding several checkpoints (``Trainer``'s ``checkpoint-N/``, Megatron-LM's
``iter_NNNNNNN/``): pick one, never guess.

Megatron-LM saves ``iter_{iteration:07d}/`` beside ``latest_checkpointed_iteration.txt``, the
iteration of its last *completed* save [R07]; ``--checkpoint latest`` in such a run takes the
iteration that file names (a save still being written is never the latest), and refuses a
tracker that names no folder here, and a tracker that is missing (or a symbolic link) where
``iter_`` folders are, as Megatron-LM's own loader does: the highest folder is never assumed.

The ``Trainer`` documentation defines a save as ``output_dir/checkpoint-N/`` (N the global step)
[R19]. Given such an output directory, the gate takes in exactly one of them, chosen with
``--checkpoint N`` or ``--checkpoint latest`` (the highest N). Without the option, a directory whose
only entry is one ``checkpoint-N/`` (beside, at most, its own ``checkpoint-N.intoto.dsse.json``) is
that checkpoint; any other directory holding ``checkpoint-N/`` folders is refused with the list of
them. Folders are compared by step number: two folders whose numbers are equal (``checkpoint-5/``
and ``checkpoint-05/``) are ambiguous for ``N`` and for ``latest`` alike, and are refused naming
both, never one chosen by its spelling. Only ASCII digits make a step number (the ``Trainer`` writes
``checkpoint-{step}``). The selected folder becomes the source: the digest, the inspection and the
receipt cover it and nothing beside it. Only names are listed here (no file is read), and a
``checkpoint-N`` that is a symbolic link is not a candidate.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ckptgate.errors import UsageError
from ckptgate.userfiles import read_regular_file

__all__ = ["CHECKPOINT_DIR", "ENVELOPE_SUFFIX", "MEGATRON_TRACKER", "list_checkpoints", "select_checkpoint"]

CHECKPOINT_DIR = re.compile(r"^(?:checkpoint-([0-9]{1,18})|iter_([0-9]{7,18}))$")
#: Megatron-LM's tracker of its last completed save, beside its ``iter_NNNNNNN/`` folders.
MEGATRON_TRACKER = "latest_checkpointed_iteration.txt"
_MAX_TRACKER_BYTES = 64
ENVELOPE_SUFFIX = ".intoto.dsse.json"
"""``checkpoint-N.intoto.dsse.json`` beside ``checkpoint-N/`` is where ``ckptgate attest checkpoint`` and the
``Trainer`` hook write a checkpoint's training provenance; beside its own folder it is no other entry."""
_STEP = re.compile(r"[0-9]{1,18}")


def list_checkpoints(root: Path) -> list[tuple[int, str]]:
    """``(N, name)`` of every ``checkpoint-N`` folder directly under ``root`` (no symlinks), by N."""
    try:
        with os.scandir(root) as it:
            found = [
                (int(m.group(1) or m.group(2)), e.name)
                for e in it
                if (m := CHECKPOINT_DIR.match(e.name)) and e.is_dir(follow_symlinks=False)
            ]
    except (NotADirectoryError, FileNotFoundError, PermissionError):
        return []
    return sorted(found)


def _names(root: Path) -> list[str]:
    try:
        with os.scandir(root) as it:
            return sorted(e.name for e in it)
    except OSError:
        return []


def _why(root: Path) -> str:
    tracker = root / MEGATRON_TRACKER
    if not os.path.lexists(tracker):
        return "it is missing"
    if os.path.islink(tracker):
        return "it is a symbolic link"
    return "unreadable or not an iteration number"


def _megatron_latest(root: Path, found: list[tuple[int, str]]) -> int:
    """The iteration Megatron-LM's tracker names: its last completed save, which must be a folder here."""
    names = [n for _, n in found]
    try:
        raw = read_regular_file(root / MEGATRON_TRACKER, limit=_MAX_TRACKER_BYTES, follow_symlinks=False)
        text = raw.decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        text = None
    step = int(text) if text is not None and len(raw) <= _MAX_TRACKER_BYTES and _STEP.fullmatch(text) else None
    if step is None or not any(n == step and name.startswith("iter_") for n, name in found):
        raise UsageError(
            "usage.checkpoint.tracker",
            f"{root / MEGATRON_TRACKER} names no iteration folder here "
            f"({_why(root) if step is None else f'iteration {step}'}; "
            f"it holds {', '.join(names)}): the last completed save is unknown",
            evidence={"source": str(root), "tracker": str(root / MEGATRON_TRACKER), "checkpoints": names},
            advice="Choose the iteration with --checkpoint N (of " + ", ".join(names) + ").",
        )
    return step


def select_checkpoint(root: Path, choice: str | None) -> Path:
    """The directory to take in: ``root`` itself, or the chosen ``root/checkpoint-N``.

    ``choice`` is ``None``, ``"latest"`` or a step number.  Raises :class:`UsageError`
    (``usage.checkpoint.ambiguous``, ``usage.checkpoint.not_found``, ``usage.checkpoint.not_a_run``).
    """
    found = list_checkpoints(root)
    names = [n for _, n in found]
    if choice is None:
        if not found:
            return root
        beside = {n + ENVELOPE_SUFFIX for n in names} | {MEGATRON_TRACKER}
        if len(found) == 1 and [n for n in _names(root) if n not in beside] == names:
            if os.path.lexists(root / MEGATRON_TRACKER):  # the one folder must be the last completed save
                _megatron_latest(root, found)
            return root / names[0]
        raise UsageError(
            "usage.checkpoint.ambiguous",
            f"{root} holds {len(found)} checkpoint folder(s) of a run ({', '.join(names)})"
            + ("" if len(found) > 1 else " beside other files")
            + "; choose one with --checkpoint N or --checkpoint latest",
            evidence={"source": str(root), "checkpoints": names},
            advice="Pass --checkpoint latest for the highest step, or --checkpoint N for checkpoint-N.",
        )
    if not found:
        raise UsageError(
            "usage.checkpoint.not_a_run",
            f"--checkpoint {choice}: {root} holds no checkpoint-N or iter_NNNNNNN folder",
            evidence={"source": str(root), "checkpoint": choice},
            advice="Give the checkpoint directory itself, without --checkpoint.",
        )
    if choice == "latest":
        megatron = os.path.lexists(root / MEGATRON_TRACKER) or any(n.startswith("iter_") for n in names)
        step = _megatron_latest(root, found) if megatron else found[-1][0]
    elif _STEP.fullmatch(choice):
        step = int(choice)
    else:
        raise UsageError(
            "usage.checkpoint.not_found",
            f"--checkpoint {choice!r} is neither a step number nor 'latest'",
            evidence={"source": str(root), "checkpoint": choice, "checkpoints": names},
            advice=f"Give --checkpoint a step number ({', '.join(names)}) or 'latest'.",
        )
    same = [name for n, name in found if n == step]
    if not same:
        raise UsageError(
            "usage.checkpoint.not_found",
            f"{root} holds no checkpoint for step {step} (it holds {', '.join(names)})",
            evidence={"source": str(root), "checkpoint": choice, "checkpoints": names},
            advice=f"Choose one it holds with --checkpoint N (of {', '.join(names)}), or --checkpoint latest.",
        )
    if len(same) > 1:
        raise UsageError(
            "usage.checkpoint.ambiguous",
            f"--checkpoint {choice}: {root} holds {len(same)} folders for step {step} ({', '.join(same)}); "
            "their step numbers are equal, so neither is chosen",
            evidence={"source": str(root), "checkpoint": choice, "step": step, "checkpoints": same},
            advice=f"Remove or rename all but one of {', '.join(same)}, or give that folder itself as the "
            f"checkpoint (such as {root / same[0]}).",
        )
    return root / same[0]
