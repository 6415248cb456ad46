"""Labelled byte bars for the long phases of a command (hashing, consolidating), on stderr."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from ckptgate._cli._base import stderr

#: The label width: the longest phase name, so the bars line up.
_LABEL = 13


@dataclass(frozen=True, slots=True)
class Phase:
    """A phase's callbacks: ``plan(total_bytes)`` shows its bar, ``advance(n)`` moves it."""

    plan: Callable[[int], None] | None = None
    advance: Callable[[int], None] | None = None


@contextlib.contextmanager
def phase_bars(enabled: bool, *phases: str, console: Console | None = None) -> Iterator[dict[str, Phase]]:
    """One bar per phase, each with its label, bytes done of total, rate and time left. A bar
    appears when its phase is planned. With ``enabled`` false (not a terminal, ``--json``,
    ``--quiet``) the callbacks are ``None`` and nothing is drawn."""
    if not enabled:
        yield {p: Phase() for p in phases}
        return
    with Progress(
        TextColumn(f"[bold]{{task.description:<{_LABEL}}}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        console=console or stderr,
        transient=True,
    ) as bar:
        tasks = {p: bar.add_task(p, total=None, visible=False) for p in phases}

        def plan(task: TaskID) -> Callable[[int], None]:
            return lambda total: bar.update(task, total=total, completed=0, visible=True)

        def advance(task: TaskID) -> Callable[[int], None]:
            return lambda n: bar.advance(task, n)

        yield {p: Phase(plan(t), advance(t)) for p, t in tasks.items()}
