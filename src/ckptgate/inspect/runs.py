"""A ``Trainer`` output directory holding several ``checkpoint-N/``: pick one, never guess.

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

__all__ = ["CHECKPOINT_DIR", "ENVELOPE_SUFFIX", "list_checkpoints", "select_checkpoint"]

CHECKPOINT_DIR = re.compile(r"^checkpoint-([0-9]{1,18})$")
ENVELOPE_SUFFIX = ".intoto.dsse.json"
"""``checkpoint-N.intoto.dsse.json`` beside ``checkpoint-N/`` is where ``ckptgate attest checkpoint`` and the
``Trainer`` hook write a checkpoint's training provenance; beside its own folder it is no other entry."""
_STEP = re.compile(r"[0-9]{1,18}")


def list_checkpoints(root: Path) -> list[tuple[int, str]]:
    """``(N, name)`` of every ``checkpoint-N`` folder directly under ``root`` (no symlinks), by N."""
    try:
        with os.scandir(root) as it:
            found = [
                (int(m.group(1)), e.name)
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
        envelopes = {n + ENVELOPE_SUFFIX for n in names}
        if len(found) == 1 and [n for n in _names(root) if n not in envelopes] == names:
            return root / names[0]
        raise UsageError(
            "usage.checkpoint.ambiguous",
            f"{root} holds {len(found)} Trainer checkpoint folder(s) ({', '.join(names)})"
            + ("" if len(found) > 1 else " beside other files")
            + "; choose one with --checkpoint N or --checkpoint latest",
            evidence={"source": str(root), "checkpoints": names},
            advice="Pass --checkpoint latest for the highest step, or --checkpoint N for checkpoint-N.",
        )
    if not found:
        raise UsageError(
            "usage.checkpoint.not_a_run",
            f"--checkpoint {choice}: {root} holds no checkpoint-N folder",
            evidence={"source": str(root), "checkpoint": choice},
            advice="Give the checkpoint directory itself, without --checkpoint.",
        )
    if choice == "latest":
        step = found[-1][0]
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
            f"{root} holds no checkpoint-{step} (it holds {', '.join(names)})",
            evidence={"source": str(root), "checkpoint": choice, "checkpoints": names},
            advice=f"Choose one it holds with --checkpoint N (of {', '.join(names)}), or --checkpoint latest.",
        )
    if len(same) > 1:
        raise UsageError(
            "usage.checkpoint.ambiguous",
            f"--checkpoint {choice}: {root} holds {len(same)} folders for step {step} ({', '.join(same)}); "
            "their step numbers are equal, so neither is chosen",
            evidence={"source": str(root), "checkpoint": choice, "step": step, "checkpoints": same},
            advice="Remove or rename all but one of these folders, or give that folder itself as the checkpoint.",
        )
    return root / same[0]
