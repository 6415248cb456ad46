"""The one pass of a world of one: the output written from the digest's own buffer.

:class:`OnePass` is the write step of the one sequence (:mod:`ckptgate.grouped`) when one process
takes in a checkpoint of the planes that run no loader: the input is read once, and the bytes
written are the bytes hashed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from ckptgate import interrupts
from ckptgate.consolidate import adapter_plan, framework_files, with_companions
from ckptgate.consolidate.chunks import open_sources
from ckptgate.consolidate.hf.plan import check_dtype, write_config_files
from ckptgate.consolidate.hf.source import HfConfig
from ckptgate.consolidate.plan import ConsolidationPlan, CopiedFile
from ckptgate.consolidate.streamed import StreamedPlan
from ckptgate.consolidate.writer import DEFAULT_CHUNK, WrittenFile, write_index, write_plan
from ckptgate.errors import Error, RuntimeFailure
from ckptgate.inspect import Inspection, SafeTree
from ckptgate.inspect._threads import usable_cores
from ckptgate.judge import PURE_DATA_LOADERS
from ckptgate.measure import Staged
from ckptgate.outcome import Consolidated, Evaluation, io_failure, still_held
from ckptgate.publish import Destination, Stage, staging

__all__ = ["ONE_PASS_LOADERS", "OnePass"]

#: The loaders of the planes that run no loader (pure data, static pickle): the output may be
#: staged in the digest's pass (:class:`OnePass`).  A checkpoint that names any other loader
#: (the framework plane) takes two passes, even when its plan comes from the static reader.
ONE_PASS_LOADERS = PURE_DATA_LOADERS | {"static_pickle"}


class OnePass:
    """Intake's single read of the input, for the planes that run no loader.

    When a checkpoint's loaders are all of the planes that run no loader
    (:data:`ONE_PASS_LOADERS`: pure data, or the static reader's facts) and no cast was asked
    for, :meth:`begin` (called by :func:`ckptgate.measure.measure` with the inspection, before the digest) plans
    from the inspection, opens a private staging directory beside DST
    (:func:`ckptgate.publish.staging`) and returns what it staged (:class:`~ckptgate.measure.Staged`):
    the digest's ``also``, by which every chunk the digest hashes is written, from the digest's own
    buffer, into the staged outputs
    (:class:`~ckptgate.consolidate.streamed.StreamedPlan`), so the input is read once and the bytes
    written are the bytes hashed.  Every companion inspection checked is staged too; the decision
    names which stay.  Nothing is published before the sequence's enforce step has enforced the decision
    (:func:`~ckptgate.enforce.gate.enforce`: a deny raises its refusal) and :func:`publish` runs;
    leaving the ``with`` block any other way removes the staging directory (a ``kill -9`` leaves it
    to the next run's sweep, :mod:`ckptgate.workdirs`).

    When the ``tree`` holds every source unchanged (:meth:`~ckptgate.inspect.SafeTree.hold`: read
    leases), the staged outputs are instead written beside the digest by the writer's held mode
    (:func:`~ckptgate.consolidate.writer.write_plan` with ``expected=None``): each output assembled
    front to back in page-aligned windows from the held sources, hashed window by window and
    written with ``O_DIRECT``, ``workers`` outputs at a time; :meth:`finish` waits for it and
    checks the leases after it, as two passes do.  The output's hash then never waits on the
    input's read order, no piece is copied to wait for its turn, and no page cache is filled
    (issue #36: a third of the one pass's CPU went to buffered writes and to reading the output
    back).  :meth:`begin` then returns ``Staged(copy_beside=True)``: the digest's threads yield
    the cores to the copy's serial chain (:func:`~ckptgate.digest.hash_files`).  The bytes written
    are the bytes hashed in either mode.

    Everything else takes two passes (the sequence's plan and write steps after the decision): the framework
    plane (nothing is loaded, or staged, before the permit; DeepSpeed ZeRO included), casts
    (``--dtype``: the plan's output sizes depend on it, and the streaming writer does not
    convert), and layouts whose plan fails before the digest (so the decision's refusal still
    comes first, as it does today).
    """

    def __init__(
        self,
        destination: Destination,
        *,
        max_shard_bytes: int,
        chunk_size: int = DEFAULT_CHUNK,
        dtype: str | None = None,
        select: str | None = None,
        hf: HfConfig | None = None,
        tree: SafeTree | None = None,
        workers: int | None = None,
    ) -> None:
        self._destination, self._max, self._chunk, self._dtype = destination, max_shard_bytes, chunk_size, dtype
        self._select, self._hf, self._tree = select, hf, tree
        self._workers = max(1, workers or usable_cores())
        self._stack = contextlib.ExitStack()
        self.stage: Stage | None = None  # once the output is being written in the digest's pass
        self._plan: ConsolidationPlan | None = None
        self._writer: StreamedPlan | None = None
        self._held: Future[tuple[WrittenFile, ...]] | None = None  # the held-mode copy beside the digest

    def __enter__(self) -> OnePass:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()  # closes the outputs, then removes the staging directory unless published

    def begin(self, inspection: Inspection) -> Staged | None:
        """Plan and stage for the one pass, or ``None`` for two passes."""
        if (
            self._dtype is not None
            or self._select is not None  # a subtree the decision will select: nothing staged before it
            or not inspection.consolidatable
            or framework_files(inspection)
            or not set(inspection.loaders) <= ONE_PASS_LOADERS
        ):
            return None
        try:
            plan = adapter_plan(inspection, max_shard_bytes=self._max, hf=self._hf)
            if self._hf is not None:
                check_dtype(plan, self._hf)
            taken = {c.filename for c in plan.copies} | {s.filename for s in plan.shards}
            maybe = tuple(
                CopiedFile(src=f.path, filename=f.path, size=f.size)
                for f in inspection.files
                if f.role == "companion" and f.path not in taken and self._hf is None
            )
        except Error:
            return None  # raised again, in its place after the decision, by the two-pass path
        staged = dataclasses.replace(plan, copies=plan.copies + maybe)
        try:
            self.stage = self._stack.enter_context(staging(self._destination))
            if self._tree is not None and self._tree.held:
                self._plan = plan
                self._start_held(staged, self._tree, self.stage.fd)
                return Staged(copy_beside=True)  # the digest only hashes: the held copy reads for itself
            self._writer = self._stack.enter_context(StreamedPlan(staged, self.stage.fd, chunk_size=self._chunk))
        except OSError as e:
            raise io_failure(e, self._destination.path) from None
        self._plan = plan
        writer, dst = self._writer, self._destination.path

        def also(path: str) -> Callable[[int, memoryview], None] | None:
            feed = writer.feeder(path)
            if feed is None:
                return None

            def write(offset: int, view: memoryview) -> None:
                try:
                    feed(offset, view)
                except OSError as e:
                    raise io_failure(e, dst) from None

            return write

        return Staged(also=also)

    def _start_held(self, staged: ConsolidationPlan, tree: SafeTree, stage_fd: int) -> None:
        """Start writing ``staged`` from the held sources on a thread of its own; leaving the
        ``with`` block cancels it, waits for it and closes the sources, before the staging
        directory goes."""
        fds = self._stack.enter_context(open_sources(tree, staged))  # closed after stop()
        cancel = threading.Event()
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckptgate-copy")

        def stop() -> None:
            cancel.set()
            pool.shutdown(wait=True)

        self._stack.callback(stop)
        self._held = pool.submit(
            write_plan,
            staged,
            stage_fd,
            fds,
            expected=None,
            chunk_size=self._chunk,
            threads=self._workers,
            index=False,
            cancel=cancel,
        )

    def _written(self, tree: SafeTree) -> dict[str, WrittenFile]:
        """The staged outputs, by name: the held copy's once it is done (then the leases checked),
        or the streamed writer's."""
        if self._held is not None:
            try:
                done = interrupts.result(self._held)
            except OSError as e:
                raise io_failure(e, self._destination.path) from None
            still_held(tree)  # the sources held unchanged from the walk to the last byte copied
            return {w.filename: w for w in done}
        assert self._writer is not None
        still_held(tree)  # the leases held from the walk to the last byte written, as in two passes
        return self._writer.finish(threads=self._workers)

    def finish(
        self,
        tree: SafeTree,
        evaluation: Evaluation,
        *,
        on_plan: Callable[[int], None] | None = None,
        on_bytes: Callable[[int], None] | None = None,
    ) -> Consolidated | None:
        """Once the decision is enforced, keep the staged outputs the final plan names (the others, the
        companions the decision did not name, are removed) and write the index.  ``None`` when the
        decision selects a subtree (the staged plan is the whole tree's): the staging directory is
        removed and the caller takes the two-pass path with the decision's plan."""
        assert self.stage is not None and self._plan is not None
        if evaluation.decision.selection is not None:
            self._stack.close()
            self.stage = self._writer = self._held = None
            return None
        plan = self._plan if self._hf else with_companions(self._plan, evaluation.inspection, evaluation.decision)
        if on_plan:
            on_plan(plan.total_size)
        if on_bytes:  # every placed byte was written in the digest's pass
            on_bytes(plan.total_size)
        written = self._written(tree)
        names = [s.filename for s in plan.shards] + [c.filename for c in plan.copies]
        for name in set(written) - set(names):
            os.unlink(name, dir_fd=self.stage.fd)
        unstaged = sorted(set(names) - set(written))
        if unstaged:
            raise RuntimeFailure(
                "runtime.copy.not_staged",
                "the decision's plan names outputs the one pass did not stage",
                evidence={"outputs": unstaged},
            )
        outputs = [written[n] for n in names]
        index = write_index(plan, self.stage.fd)
        if index is not None:
            outputs.append(index)
        if self._hf is not None:
            outputs += write_config_files(self._hf, self.stage.fd)
        return Consolidated(outputs=tuple(outputs), plan_report=dict(plan.report))
