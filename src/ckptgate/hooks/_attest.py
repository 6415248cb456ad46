"""The producer-side helpers behind every hook: every rank arrives, then the main process attests."""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from ckptgate.errors import Error, RuntimeFailure
from ckptgate.inspect.runs import ENVELOPE_SUFFIX
from ckptgate.producer.attest import Attested, AttestRequest, attest_checkpoint
from ckptgate.producer.keyless import SIGSTORE_SUFFIX
from ckptgate.userfiles import read_regular_file

__all__ = ["after_accelerate_save", "after_dcp_save", "after_deepspeed_save", "attest_saved"]

_TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_GLOBAL_STEP = re.compile(r"^global_step([0-9]{1,18})$")


class _CallKeys:
    """The store key of each hook call of this process: the checkpoint's path (a short sha256 of its absolute
    path as spelled, links not resolved: a link may resolve differently on another node, or change between
    two ranks' reads) and how many calls for that path came before, so calls for different checkpoints (from several
    threads, in any order) never share a key, and each rank's n-th call for a path meets the others' n-th.

    Also the calls of this process still waiting for the other ranks (:meth:`opened`, :meth:`closed`): their
    keys and spellings, which this rank publishes in the store (:func:`_open_key`) for the rank before it to
    compare with its own (:meth:`_Call.arrive`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[str, int] = {}
        self._open: dict[str, str] = {}

    def next(self, path: Path | str) -> str:
        digest = hashlib.sha256(os.fsencode(_spelling(path))).hexdigest()[:16]
        with self._lock:
            n = self._calls.get(digest, 0)
            self._calls[digest] = n + 1
        return f"{_prefix()}/{digest}/{n}"

    def opened(self, store: Any, rank: int, key: str, spelling: str) -> None:
        """The call ``key`` (for ``spelling``) waits for the other ranks: published for them."""
        with self._lock:  # one writer per process, so the store holds the latest set
            self._open[key] = spelling
            store.set(_open_key(rank), json.dumps(self._open))

    def closed(self, store: Any, rank: int, key: str) -> None:
        with self._lock:
            if self._open.pop(key, None) is not None:
                store.set(_open_key(rank), json.dumps(self._open))


def _spelling(path: Path | str) -> str:
    """The checkpoint's absolute path as this rank spells it (links not resolved)."""
    return os.path.abspath(os.fspath(path))


def _prefix() -> str:
    # the elastic restart too: a restarted job's store may keep an earlier attempt's keys
    return f"ckptgate/attest/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def _open_key(rank: int) -> str:
    """Where ``rank`` publishes the calls it waits in: ``{key: spelling}``, JSON."""
    return f"{_prefix()}/open/{rank}"


_KEYS = _CallKeys()


def _dist() -> Any:
    """``torch.distributed`` when torch is already imported and a process group is up, else ``None``
    (a hook never imports torch itself: a job that has none has no ranks to wait for)."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist
    return None


def _default_store(dist: Any) -> Any:
    """The default process group's store.  torch has no public accessor for it (none in 2.13's
    ``torch.distributed``: ``init_process_group`` keeps it in ``distributed_c10d``, read through the private
    ``_get_default_store``), so this one function reads the private one, and a torch without it is a typed
    refusal rather than an ``AttributeError``."""
    get = getattr(getattr(dist, "distributed_c10d", None), "_get_default_store", None)
    try:
        if get is None:
            raise AttributeError("torch.distributed.distributed_c10d._get_default_store")
        return get()
    except Exception as e:
        version = getattr(sys.modules.get("torch"), "__version__", "unknown")
        raise RuntimeFailure(
            "runtime.attest.no_store",
            f"the hook could not reach the default process group's store in this torch ({version}): "
            f"{type(e).__name__}: {str(e)[:200]}; the ranks cannot meet, so nothing was signed",
            evidence={"torch": version},
            advice=f"Use a torch release ckptgate supports (this one is {version}) with a process group started "
            "by init_process_group, or call the hook without a process group on a single process.",
        ) from None


def attest_saved(
    path: Path | str,
    *,
    key: Path | str | None = None,
    builder_id: str | None = None,
    topology: Mapping[str, Any] | None = None,
    producers: Mapping[str, str] | None = None,
    training_config: Mapping[str, Any] | None = None,
    step: int | None = None,
    started: datetime | None = None,
    out: Path | str | None = None,
    main_process: bool | None = None,
    identity_token: str | None = None,
    sigstore_trust_config: Path | str | None = None,
) -> Attested | None:
    """Attest the complete checkpoint at ``path``; returns what was written on the main process, ``None``
    on the others.  ``key`` defaults to ``$CKPTGATE_SIGNING_KEY``; with ``identity_token`` (and
    ``sigstore_trust_config``) the main process signs keyless instead (Sigstore bundle ``<path>.sigstore.json``).

    With a process group, every rank calls this once its own files of the save are written, and the main
    process (rank 0, unless ``main_process`` says) measures the files once every rank has arrived.  Exactly
    one rank must be the main process: when none or several say so, every rank raises
    ``runtime.attest.main_process`` (promptly, once all have arrived) and nothing is signed.  Every rank
    names the checkpoint by the same absolute path and calls the hooks for a given path in the same order;
    ranks that name it by two paths (a link, another mount point) raise ``runtime.attest.path_mismatch``
    within seconds.  Calls for different checkpoints (from several threads, say) are independent of one
    another."""
    fields = {name: value for name, value in locals().items() if name in _FIELDS}  # the keywords, as given
    return _attest_once(path, main_process, lambda dist: _attest_main(dist, path, fields))


def _attest_once(path: Path | str, main_process: bool | None, attest: Callable[[Any], Attested]) -> Attested | None:
    """Every rank arrives, then ``attest`` runs on the main process alone and every rank learns how it went."""
    dist = _dist()
    if dist is None:
        return attest(None) if main_process is None or main_process else None
    rank, world = int(dist.get_rank()), int(dist.get_world_size())
    if main_process is None:
        main_process = rank == 0
    call = _Call(_default_store(dist), _KEYS.next(path), rank, world, path)
    mains = call.arrive(bool(main_process))  # the barrier: every rank's files are written before any is measured
    if mains != 1:
        call.mark_read()
        raise RuntimeFailure(
            "runtime.attest.main_process",
            f"{mains} of the {world} ranks said they were the main process for {path} (this rank, {rank}, said "
            f"{'it was' if main_process else 'it was not'}); exactly one must attest, so nothing was signed",
            evidence={"main_processes": mains, "world_size": world, "rank": rank, "path": str(path)},
            advice=f"Pass main_process=True on exactly one of the {world} ranks (or leave it unset everywhere: "
            f"rank 0 is then the main process) and save {path} again; nothing was signed for it.",
        )
    if not main_process:
        call.read_outcome()  # raises what the main process raised
        return None
    try:
        done = attest(dist)
    except BaseException as e:
        with contextlib.suppress(Error):  # the main process raises its own error, whatever the store did
            call.share_outcome(e)
        raise
    call.share_outcome(None)
    return done


#: How soon a waiting rank first looks for a rank that spells the checkpoint otherwise, and the most it
#: waits between two looks (each doubles the last).
_POLL_S, _POLL_MAX_S = 1.0, 4.0
#: How long rank 0 waits, on a path mismatch, for every rank to have read it before it raises (and may exit).
_MISMATCH_GRACE_S = 10.0


def _store_timeout(store: Any) -> float:
    """The store's own timeout in seconds (``init_process_group``'s ``timeout``), 30 minutes where not known."""
    timeout = getattr(store, "timeout", None)
    if isinstance(timeout, timedelta):
        return timeout.total_seconds()
    return float(timeout) if isinstance(timeout, int | float) else 1800.0


class _Call:
    """One hook call's exchange through the process group's store, as JSON, never a tensor collective: a gloo
    worker thread drops a finished collective's tensors a moment after the call returns, and when the job
    exits right after its last save (an FSDP model keeps the group alive past ``destroy_process_group``) that
    drop needs the GIL during interpreter shutdown and aborts the rank (about one run in ten on torch 2.13).
    Nothing is unpickled either.

    * Arrival, the barrier: each rank adds whether it is the main process to ``<key>/mains``, then sets
      ``<key>/arrived/<rank>`` and waits for every rank's; ``<key>/mains`` then holds how many ranks said they
      were the main process, the same total on every rank (each added before it arrived).
    * Outcome: the main process sets ``<key>`` to how its attestation went (``{"ok": true}`` or its error's
      code and message); the others read it, and a refusal there is raised on every rank, so no rank trains
      on into a collective the failed one never reaches.
    * Every rank marks its reads done (``<key>/read/<rank>``) once it needs the store no more; rank 0 returns
      only once every rank has (it hosts the store under ``init_process_group``'s ``env://`` and ``tcp://``
      rendezvous, and may exit right after), then removes the keys, for tidiness only.

    ``key`` names the checkpoint and the call (:class:`_CallKeys`): every rank calls the hooks for a given path
    in the same order.  Ranks that spell one checkpoint two ways (a link, another node's mount point) wait at
    two keys: while it waits, each rank compares the calls its next rank waits in with its own, on its own
    file system, and a spelling of the same folder, or one this node does not have, is
    ``runtime.attest.path_mismatch`` on every rank within seconds, not at the store's timeout.  A store that
    fails, or a rank that never arrives before the store's timeout, is ``runtime.attest.store`` on the ranks
    that saw it."""

    def __init__(self, store: Any, key: str, rank: int, world: int, path: Path | str) -> None:
        self.store, self.key, self.rank, self.world, self.path = store, key, rank, world, path
        self.spelling = _spelling(path)

    def _do(self, step: str, op: Callable[[Any], Any]) -> Any:
        try:
            return op(self.store)
        except Error:
            raise
        except Exception as e:  # a store timeout or a lost connection: typed, never a traceback
            raise RuntimeFailure(
                "runtime.attest.store",
                f"the process group's store failed while {step} for {self.path} (rank {self.rank} of "
                f"{self.world}): {type(e).__name__}: {str(e)[:300]}",
                evidence={"step": step, "store_key": self.key, "rank": self.rank, "path": str(self.path)},
                advice=f"Check that every one of the {self.world} ranks called the hook for {self.path} (by the "
                f"same path, in the same order of saves) and that the job's store is still up (store key "
                f"{self.key}).",
            ) from None

    def _set(self, step: str, name: str, value: str) -> None:
        self._do(step, lambda s: s.set(name, value))

    def arrive(self, main: bool) -> int:
        """Arrive, wait for every rank, and return how many ranks said they were the main process."""
        k = self.key
        self._do("counting the main processes", lambda s: s.add(f"{k}/mains", 1 if main else 0))
        self._do("arriving", lambda s: s.set(f"{k}/arrived/{self.rank}", "1"))
        self._do("publishing this rank's spelling", lambda s: _KEYS.opened(s, self.rank, k, self.spelling))
        try:
            self._wait_for_every_rank()
        finally:
            with contextlib.suppress(Error):
                self._do("publishing this rank's spelling", lambda s: _KEYS.closed(s, self.rank, k))
        return int(self._do("counting the main processes", lambda s: s.add(f"{k}/mains", 0)))

    def _wait_for_every_rank(self) -> None:
        """Wait until every rank has arrived, up to the store's timeout; meanwhile, every few seconds, look for
        a rank that names this checkpoint by another path (:meth:`_other_spelling`), which would wait at
        another key until that timeout (30 minutes by default): ``runtime.attest.path_mismatch`` then, on
        this rank and on the ranks at either key."""
        k = self.key
        arrived = [f"{k}/arrived/{r}" for r in range(self.world)]
        deadline = time.monotonic() + _store_timeout(self.store)
        poll, absent = _POLL_S, 0
        while True:
            step = max(0.01, min(poll, deadline - time.monotonic()))
            try:
                self.store.wait(arrived, timedelta(seconds=step))
                return
            except Exception:  # the poll's time is up (a lost store fails the calls below, typed)
                pass
            if self._do("reading the other ranks' paths", lambda s: s.check([f"{k}/mismatch"])):
                raise self._mismatch(json.loads(self._do("reading the mismatch", lambda s: s.get(f"{k}/mismatch"))))
            other = self._other_spelling()
            absent = absent + 1 if other is not None and other[2] == "absent" else 0
            if other is not None and (other[2] == "same" or absent >= 2):  # absent twice: no file system lag
                q, (key, spelling), _ = other
                found = {"id": min(k, key), "rank": self.rank, "path": self.spelling}
                found |= {"other_rank": q, "other_path": spelling}
                for at in (k, key):  # every rank waiting at either key raises it too
                    self._set("sharing the mismatch", f"{at}/mismatch", json.dumps(found))
                raise self._mismatch(found)
            if time.monotonic() >= deadline:
                self._do("waiting for every rank", lambda s: s.wait(arrived, timedelta(seconds=0.01)))
                return
            poll = min(poll * 2, _POLL_MAX_S)

    def _other_spelling(self) -> tuple[int, tuple[str, str], str] | None:
        """A call the next rank waits in that names this rank's checkpoint by another path, seen from this
        node: the same file (``"same"``: a link, another mount of it), or a path to a folder of the same name
        that is not here while ours is (``"absent"``: a mount point this node lacks; a folder of another name
        may be another checkpoint, not written on this node yet).  Only the next rank (modulo the world): where the
        ranks spell the checkpoint two ways, some rank's next one spells it the other way, so one store read
        per rank and poll finds it.  A call for another checkpoint that is here (a thread saving it) is not
        one."""
        q = (self.rank + 1) % self.world
        k = self.key
        if q == self.rank or self._do("reading the other ranks' paths", lambda s: s.check([f"{k}/arrived/{q}"])):
            return None
        if not self._do("reading the other ranks' paths", lambda s: s.check([_open_key(q)])):
            return None
        try:
            calls = json.loads(self._do("reading the other ranks' paths", lambda s: s.get(_open_key(q))))
        except ValueError:
            return None
        if not isinstance(calls, dict):
            return None
        for key, spelling in calls.items():
            if key == k or not isinstance(spelling, str) or spelling == self.spelling:
                continue
            try:
                if os.path.samefile(spelling, self.spelling):
                    return q, (key, spelling), "same"
            except (OSError, ValueError):
                # only a folder of the same name: another checkpoint may not be written on this node yet
                same_name = os.path.basename(spelling) == os.path.basename(self.spelling)
                if same_name and not os.path.lexists(spelling) and os.path.exists(self.spelling):
                    return q, (key, spelling), "absent"
        return None

    def _mismatch(self, found: Mapping[str, Any]) -> RuntimeFailure:
        """``runtime.attest.path_mismatch`` for ``found`` (the record shared at both keys); rank 0, which hosts
        the store and may exit next, first gives every rank a few seconds to have read it."""
        seen = f"{_prefix()}/mismatch/{found.get('id')}"
        with contextlib.suppress(Error):
            self._do("marking the mismatch read", lambda s: s.set(f"{seen}/{self.rank}", "1"))
            if self.rank == 0:
                grace = timedelta(seconds=_MISMATCH_GRACE_S)
                self._do("waiting for every rank", lambda s: s.wait([f"{seen}/{r}" for r in range(self.world)], grace))
        a, b = (found.get("rank"), found.get("path")), (found.get("other_rank"), found.get("other_path"))
        return RuntimeFailure(
            "runtime.attest.path_mismatch",
            f"rank {a[0]} names the checkpoint {a[1]} and rank {b[0]} names it {b[1]} (the same checkpoint by another "
            "path, or a path the other node does not have): the ranks meet by the path as spelled, and would have "
            f"waited for one another until the store's timeout; this rank ({self.rank}) stopped, nothing was signed",
            evidence={"rank": a[0], "path": a[1], "other_rank": b[0], "other_path": b[1], "this_rank": self.rank},
            advice=f"Call the hook with the same absolute path on every rank (rank {a[0]} gave {a[1]}, rank {b[0]} "
            f"gave {b[1]}): the shared file system's path as every node mounts it, not one node's link or mount "
            f"point; then start the job again (its ranks now count the saves of {self.path} differently).",
        )

    def share_outcome(self, failure: BaseException | None) -> None:
        """On the main process: share how its attestation went."""
        outcome: dict[str, Any] = {"ok": True}
        if failure is not None:
            outcome = (
                failure.to_json()["error"]
                if isinstance(failure, Error)
                else {"code": "runtime.attest.failed", "message": type(failure).__name__}
            )
        self._do("sharing the outcome", lambda s: s.set(self.key, json.dumps(outcome)))
        self.mark_read()

    def read_outcome(self) -> None:
        """On the other ranks: raise what the main process raised."""
        raw = self._do("reading the main process's outcome", lambda s: s.get(self.key))
        self.mark_read()
        try:
            failed = json.loads(raw)
        except ValueError:
            failed = None
        if not isinstance(failed, dict):
            failed = {"code": "runtime.attest.outcome_unreadable", "message": f"the store held {bytes(raw)[:80]!r}"}
        if failed.get("ok") is not True:
            raise RuntimeFailure(
                "runtime.attest.failed_on_main",
                f"the main process did not attest {self.path}: [{failed.get('code')}] {failed.get('message')}",
                evidence={"code": failed.get("code"), "path": str(self.path)},
                advice=f"Read the main process's error ({failed.get('code')}) in its log; nothing was signed for "
                f"{self.path}.",
            )

    def mark_read(self) -> None:
        """This rank needs the store no more for this call; rank 0 waits for every rank's mark, then tidies."""
        k = self.key
        read = [f"{k}/read/{r}" for r in range(self.world)]
        self._do("marking the outcome read", lambda s: s.set(read[self.rank], "1"))
        if self.rank != 0:
            return
        self._do("waiting for every rank to read the outcome", lambda s: s.wait(read))
        arrived = [f"{k}/arrived/{r}" for r in range(self.world)]
        for name in (k, f"{k}/mains", *arrived, *read):  # tidiness only: the next call has its own keys
            with contextlib.suppress(RuntimeError, NotImplementedError):
                self.store.delete_key(name)


#: What the main process's attestation takes: ``attest_saved``'s keywords, less ``main_process``.
_FIELDS = frozenset(inspect.signature(attest_saved).parameters) - {"path", "main_process"}


def _attest_main(dist: Any, path: Path | str, fields: Mapping[str, Any]) -> Attested:
    """The main process's attestation of ``path``; ``fields``: ``attest_saved``'s keywords (:data:`_FIELDS`)."""

    def as_path(name: str) -> Path | None:
        value = fields.get(name)
        return Path(value) if value is not None else None

    declared = dict(fields.get("topology") or {})
    if dist is not None:
        declared.setdefault("world_size", dist.get_world_size())
    request = AttestRequest(
        src=Path(path),
        key=as_path("key"),
        out=as_path("out"),
        builder_id=fields.get("builder_id"),
        producers=dict(fields.get("producers") or {}),
        topology=declared,
        training_config=fields.get("training_config"),
        step=fields.get("step"),
        started=fields.get("started"),
        identity_token=fields.get("identity_token"),
        sigstore_trust_config=as_path("sigstore_trust_config"),
    )
    return attest_checkpoint(request)


def after_dcp_save(checkpoint_id: Path | str, **kwargs: Any) -> Attested | None:
    """Call on every rank right after ``torch.distributed.checkpoint.save(..., checkpoint_id=...)``
    (or a ``FileSystemWriter`` on that folder): rank 0 attests the folder once every rank has written."""
    return attest_saved(checkpoint_id, **kwargs)


def after_accelerate_save(accelerator: Any, output_dir: Path | str, **kwargs: Any) -> Attested | None:
    """Call on every process right after ``accelerator.save_state(output_dir)``: the main process attests
    ``output_dir`` once every process has finished writing (with a ``torch.distributed`` process group, the
    hook's own exchange through its store is the wait; else ``accelerator.wait_for_everyone()``)."""
    if _dist() is None:
        accelerator.wait_for_everyone()
    kwargs.setdefault("topology", {"world_size": accelerator.num_processes})
    return attest_saved(output_dir, main_process=bool(accelerator.is_main_process), **kwargs)


def _latest_tag(save_dir: Path) -> str | None:
    """The tag DeepSpeed's ``latest`` names (the save just made), or ``None`` without one."""
    try:
        raw = read_regular_file(save_dir / "latest", limit=4096, follow_symlinks=False)
    except OSError:
        return None
    tag = raw.decode("utf-8", "replace").strip()
    return tag if _TAG.match(tag) else None


def after_deepspeed_save(engine: Any, save_dir: Path | str, **kwargs: Any) -> Attested | None:
    """Call on every rank right after ``engine.save_checkpoint(save_dir)`` (or ``(save_dir, tag)``, then pass
    ``tag=``): rank 0 attests ``save_dir`` (its ``latest`` and ``global_stepN/`` partitions) once every rank has
    written its partition.  A training job saves into the same ``save_dir`` again and again, so each save gets
    its own statement, ``<save_dir>.<tag>.intoto.dsse.json`` (``.sigstore.json`` keyless), the tag being
    DeepSpeed's default, ``global_step<engine.global_steps>``, where that folder is there (``latest`` is stale
    after ``save_latest=False``), else the one ``latest`` names; its step is the tag's ``global_stepN`` unless
    ``step`` says."""
    unknown = sorted(set(kwargs) - _FIELDS - {"tag", "main_process"})
    if unknown:
        raise TypeError(f"after_deepspeed_save() got unexpected keyword arguments {unknown}")
    topology = dict(kwargs.pop("topology", None) or {})
    stage = getattr(engine, "zero_optimization_stage", None)
    if callable(stage):
        topology.setdefault("zero_stage", int(stage()))
    tag = kwargs.pop("tag", None)
    main_process = kwargs.pop("main_process", None)
    root = Path(save_dir)

    def attest(dist: Any) -> Attested:
        """On the main process, once every rank is past ``save_checkpoint`` (rank 0 writes ``latest``)."""
        fields = dict(kwargs)
        named = tag
        if named is None:  # DeepSpeed's own default tag, whose folder this save wrote; else the one ``latest`` names
            steps = getattr(engine, "global_steps", None)
            default = f"global_step{steps}" if isinstance(steps, int) and not isinstance(steps, bool) else None
            named = default if default is not None and (root / default).is_dir() else _latest_tag(root)
        if named is not None and fields.get("out") is None:
            suffix = SIGSTORE_SUFFIX if fields.get("identity_token") is not None else ENVELOPE_SUFFIX
            fields["out"] = root.parent / f"{root.name}.{named}{suffix}"
        if named is not None and fields.get("step") is None and (m := _GLOBAL_STEP.match(named)):
            fields["step"] = int(m.group(1))
        return _attest_main(dist, save_dir, {**fields, "topology": topology})

    return _attest_once(save_dir, main_process, attest)
