"""The producer-side helpers behind every hook: wait for every rank, then attest on the main process."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import sys
from collections.abc import Mapping
from datetime import datetime
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
_CALLS = itertools.count()  # this process's hook calls, in order: the key of each call's outcome


def _dist() -> Any:
    """``torch.distributed`` when torch is already imported and a process group is up, else ``None``
    (a hook never imports torch itself: a job that has none has no ranks to wait for)."""
    torch = sys.modules.get("torch")
    dist = getattr(torch, "distributed", None) if torch is not None else None
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist
    return None


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
    With a process group, every rank waits
    for the others before the main process (rank 0, unless ``main_process`` says) measures the files."""
    dist = _dist()
    if dist is not None:
        dist.barrier()  # every rank's files are written before any is measured
    if main_process is None:
        main_process = dist is None or dist.get_rank() == 0
    if not main_process:
        _shared_outcome(dist, None, path, main=False)  # raises what the main process raised
        return None
    try:
        done = _attest_main(
            dist,
            path,
            key,
            builder_id,
            topology,
            producers,
            training_config,
            step,
            started,
            out,
            identity_token,
            sigstore_trust_config,
        )
    except BaseException as e:
        _shared_outcome(dist, e, path, main=True)
        raise
    _shared_outcome(dist, None, path, main=True)
    return done


def _shared_outcome(dist: Any, failure: BaseException | None, path: Path | str, *, main: bool) -> None:
    """With a process group, every rank learns how the main process's attestation went: a refusal there is
    raised on every rank, so no rank trains on into a collective the failed one never reaches.

    The outcome goes through the process group's store as JSON, never through a tensor collective: a gloo
    worker thread drops a finished collective's tensors a moment after the call returns, and when the job
    exits right after its last save (an FSDP model keeps the group alive past ``destroy_process_group``)
    that drop needs the GIL during interpreter shutdown and aborts the rank (about one run in ten on torch
    2.13). Nothing is unpickled either. Every rank marks the outcome read, and the main process returns only
    once all have (it may host the store, and exit right after), then removes the keys. The keys name the
    elastic restart (a restarted job's store may keep an earlier attempt's) and the call: every rank calls
    the hooks in the same order."""
    if dist is None:
        return
    store = dist.distributed_c10d._get_default_store()
    key = f"ckptgate/attest/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{next(_CALLS)}"
    read = [f"{key}/read/{r}" for r in range(dist.get_world_size())]
    if main:
        outcome: dict[str, Any] = {"ok": True}
        if failure is not None:
            outcome = (
                failure.to_json()["error"]
                if isinstance(failure, Error)
                else {"code": "runtime.attest.failed", "message": type(failure).__name__}
            )
        store.set(key, json.dumps(outcome))
        store.set(read[dist.get_rank()], "1")
        store.wait(read)  # every rank has read it: the main process may host the store, and exit next
        for k in (key, *read):  # tidiness only: the next call has its own keys
            with contextlib.suppress(RuntimeError, NotImplementedError):
                store.delete_key(k)
        return  # the main process raises its own error
    raw = store.get(key)
    store.set(read[dist.get_rank()], "1")
    try:
        failed = json.loads(raw)
    except ValueError:
        failed = None
    if not isinstance(failed, dict):
        failed = {"code": "runtime.attest.outcome_unreadable", "message": f"the store held {bytes(raw)[:80]!r}"}
    if failed.get("ok") is not True:
        raise RuntimeFailure(
            "runtime.attest.failed_on_main",
            f"the main process did not attest {path}: [{failed.get('code')}] {failed.get('message')}",
            evidence={"code": failed.get("code"), "path": str(path)},
            advice=f"Read the main process's error ({failed.get('code')}) in its log; nothing was signed for {path}.",
        )


def _attest_main(
    dist: Any,
    path: Path | str,
    key: Path | str | None,
    builder_id: str | None,
    topology: Mapping[str, Any] | None,
    producers: Mapping[str, str] | None,
    training_config: Mapping[str, Any] | None,
    step: int | None,
    started: datetime | None,
    out: Path | str | None,
    identity_token: str | None,
    sigstore_trust_config: Path | str | None,
) -> Attested:
    declared = dict(topology or {})
    if dist is not None:
        declared.setdefault("world_size", dist.get_world_size())
    request = AttestRequest(
        src=Path(path),
        key=Path(key) if key is not None else None,
        out=Path(out) if out is not None else None,
        builder_id=builder_id,
        producers=dict(producers or {}),
        topology=declared,
        training_config=training_config,
        step=step,
        started=started,
        identity_token=identity_token,
        sigstore_trust_config=Path(sigstore_trust_config) if sigstore_trust_config is not None else None,
    )
    return attest_checkpoint(request)


def after_dcp_save(checkpoint_id: Path | str, **kwargs: Any) -> Attested | None:
    """Call on every rank right after ``torch.distributed.checkpoint.save(..., checkpoint_id=...)``
    (or a ``FileSystemWriter`` on that folder): rank 0 attests the folder once every rank has written."""
    return attest_saved(checkpoint_id, **kwargs)


def after_accelerate_save(accelerator: Any, output_dir: Path | str, **kwargs: Any) -> Attested | None:
    """Call on every process right after ``accelerator.save_state(output_dir)``: the main process attests
    ``output_dir`` once every process has finished writing."""
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
    topology = dict(kwargs.pop("topology", None) or {})
    stage = getattr(engine, "zero_optimization_stage", None)
    if callable(stage):
        topology.setdefault("zero_stage", int(stage()))
    tag = kwargs.pop("tag", None)
    dist = _dist()
    if dist is not None:
        dist.barrier()  # rank 0 writes latest: read it once every rank is past save_checkpoint
    root = Path(save_dir)
    if tag is None:  # DeepSpeed's own default tag, whose folder this save wrote; else the one ``latest`` names
        steps = getattr(engine, "global_steps", None)
        default = f"global_step{steps}" if isinstance(steps, int) and not isinstance(steps, bool) else None
        tag = default if default is not None and (root / default).is_dir() else _latest_tag(root)
    if tag is not None and kwargs.get("out") is None:
        suffix = SIGSTORE_SUFFIX if kwargs.get("identity_token") is not None else ENVELOPE_SUFFIX
        kwargs["out"] = root.parent / f"{root.name}.{tag}{suffix}"
    if tag is not None and kwargs.get("step") is None and (m := _GLOBAL_STEP.match(tag)):
        kwargs["step"] = int(m.group(1))
    return attest_saved(save_dir, topology=topology, **kwargs)
