"""The launch of ``ckptgate intake --distributed``: the torch.distributed group and its signals.

The intake itself is :func:`ckptgate.grouped.grouped_intake`, the same steps for any world size;
this module only forms the group it runs over.  Under ``torchrun`` (or any launcher that sets
torch.distributed's ``env://`` variables), every rank runs :func:`distributed_intake` on the same
SRC and DST, on one shared file system; rank 0 opens the policy engine before the rendezvous (so
the embedded OPA launches while torch imports).

Messages between ranks are data: JSON in ``uint8`` tensors (``all_gather``), never pickle-based
object collectives (:class:`TorchGroup`), each authenticated with an HMAC-SHA256 keyed by the
per-job secret in :data:`SECRET_ENV` and bound to the phase, the sequence number, the sender's
rank, the world size, the job's nonce (the first exchange: rank 0 picks a random one, and every
rank adds its own) and, once the ranks have formed it, the fixture digest: a message recorded in
one job is refused in another that shares the secret.  A wrong HMAC, or a rank that dies or stops
answering (the collectives' timeout), fails every rank (:meth:`ckptgate.group.Group.agree`): the
staging directory is removed and nothing is published.  A SIGTERM (the launcher stopping this rank
after another failed) unwinds it the same way, unless the rename has already published.
gloo is unencrypted: the rendezvous and the ranks must stay on the job's private network [R28].
``--select`` is refused; ``--dtype`` casts in the one writer, at any world size.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import re
import secrets
import signal
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from ckptgate import interrupts
from ckptgate.decide.options import EngineOptions
from ckptgate.errors import Error, RuntimeFailure, UsageError
from ckptgate.group import Group, Relayed, canonical
from ckptgate.grouped import EarlyEngine, grouped_intake
from ckptgate.pipeline import IntakeResult

__all__ = ["SECRET_ENV", "DistributedOptions", "Relayed", "TorchGroup", "distributed_intake"]

#: The environment variable that carries the per-job secret every message is authenticated with.
SECRET_ENV = "CKPTGATE_DIST_SECRET"
MIN_SECRET_BYTES = 16
#: Each rank's share of the job's nonce (rank 0's first among them), from :func:`secrets.token_hex`.
NONCE_BYTES = 32
#: No message between ranks may be larger (a peer that claims more is refused before allocation).
MAX_MESSAGE = 1 << 30


@dataclass(frozen=True, slots=True, kw_only=True)
class DistributedOptions:
    """How long any one exchange may wait for every rank (the collectives' timeout)."""

    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if not (0 < self.timeout_s <= 86400):
            raise UsageError(
                "usage.distributed.timeout",
                f"the distributed deadline must be between 0 and 86400 seconds, not {self.timeout_s!r}",
                advice=f"Pass --dist-timeout with a number of seconds in (0, 86400] instead of {self.timeout_s!r}.",
            )


def _peer_lost(what: str, e: BaseException) -> RuntimeFailure:
    return RuntimeFailure(
        "runtime.distributed.peer_lost",
        f"a rank did not answer in the {what} exchange (it died, or passed the deadline): "
        f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}; nothing was published",
        evidence={"phase": what},
        advice=f"Read every rank's output and the launcher's for why a rank stopped in the {what} exchange, "
        "then run the intake again (raise --dist-timeout if a rank was only slow).",
    )


def _secret() -> bytes:
    raw = os.environ.get(SECRET_ENV, "")
    if len(raw.encode()) < MIN_SECRET_BYTES:
        raise UsageError(
            "usage.distributed.secret",
            f"--distributed needs a per-job secret of at least "
            f"{MIN_SECRET_BYTES} bytes in ${SECRET_ENV}, the same on every rank, to authenticate "
            "the messages between ranks" + ("" if raw else "; none was set"),
            advice=f"Generate one per job (e.g. `openssl rand -hex 32`) and pass it to every rank "
            f"in ${SECRET_ENV}; see docs/scale-out.md.",
        )
    return raw.encode()


def _count(value: str | None) -> int | None:
    """A launcher's count (RANK, WORLD_SIZE, MASTER_PORT) as torchrun writes it: decimal digits, no sign."""
    return int(value) if value is not None and re.fullmatch(r"0|[1-9][0-9]{0,8}", value) else None


def silent_rank() -> bool:
    """Whether this process is a rank other than 0 of a well-formed launch, which leaves a refusal that
    every rank meets alike to rank 0 to report; a RANK that is no rank (``x``, ``-1``, ``01``, one past
    WORLD_SIZE) is not: that process alone knows its launch is wrong, and says so."""
    rank, world = _count(os.environ.get("RANK", "0")), _count(os.environ.get("WORLD_SIZE", ""))
    return rank is not None and rank != 0 and (world is None or rank < world)


def _launcher_env() -> None:
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)]
    if missing:
        raise UsageError(
            "usage.distributed.no_launcher",
            f"--distributed runs under torchrun or a launcher that "
            f"sets torch.distributed's environment; {', '.join(missing)} is not set",
            advice="Run `torchrun --nproc-per-node N -m ckptgate intake ... --distributed`.",
        )
    raw = {k: os.environ[k] for k in ("RANK", "WORLD_SIZE", "MASTER_PORT")}
    rank, world, port = (_count(raw[k]) for k in ("RANK", "WORLD_SIZE", "MASTER_PORT"))
    bad = []
    if world is None or world < 1:
        bad.append(f"WORLD_SIZE={raw['WORLD_SIZE']!r} is not a positive integer")
    elif rank is None or rank >= world:
        bad.append(f"RANK={raw['RANK']!r} is not an integer from 0 to {world - 1} (WORLD_SIZE={world})")
    if port is None or not 0 < port < 65536:
        bad.append(f"MASTER_PORT={raw['MASTER_PORT']!r} is not a port from 1 to 65535")
    if bad:
        raise UsageError(
            "usage.distributed.launcher_env",
            f"--distributed cannot join the job: {'; '.join(bad)}",
            evidence=raw,
            advice=f"Launch with `torchrun --nproc-per-node N -m ckptgate intake ... --distributed`, which sets "
            f"RANK, WORLD_SIZE and MASTER_PORT itself; this process was given {raw}.",
        )


class TorchGroup(Group):
    """The ranks of a torch.distributed job: authenticated exchanges of JSON, over ``all_gather`` of bytes."""

    def __init__(self, dist: Any, torch: Any, secret: bytes) -> None:
        self.dist, self.torch, self.secret = dist, torch, secret
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.seq = 0
        self.nonce = ""  # this job's, from the first exchange (:meth:`start`)
        self.fixture = ""  # the fixture digest, once the ranks have formed it (:meth:`bind_fixture`)

    def _mac(self, phase: str, sender: int, body: bytes) -> bytes:
        head = [phase, self.seq, sender, self.world, self.nonce, self.fixture]
        return hmac.new(
            self.secret, json.dumps(head, separators=(",", ":")).encode() + b"\0" + body, hashlib.sha256
        ).digest()

    def start(self) -> None:
        """The first exchange: rank 0 picks a random nonce (every other rank adds one of its own), and
        this job's nonce, the sha256 of them all in rank order, is bound into every later message's
        HMAC.  A message recorded in another job that shares the secret carries another job's nonce:
        it is refused (``runtime.distributed.unauthenticated``), from the second exchange on."""
        hellos = self.exchange("nonce", {"nonce": secrets.token_hex(NONCE_BYTES)})
        nonces = [h.get("nonce") if isinstance(h, dict) else None for h in hellos]
        if not all(isinstance(n, str) and len(n) == 2 * NONCE_BYTES for n in nonces):
            raise RuntimeFailure(
                "runtime.distributed.message",
                "a rank's first message carries no nonce of the expected size; refused",
                evidence={"phase": "nonce"},
            )
        self.nonce = hashlib.sha256("".join(str(n) for n in nonces).encode()).hexdigest()

    def bind_fixture(self, digest: str) -> None:
        """From now on every message's HMAC also covers the fixture digest the ranks formed."""
        self.fixture = digest

    def exchange(self, phase: str, data: Any) -> list[Any]:
        """Every rank's ``data`` (JSON, keys in their order), in rank order, each message's HMAC checked."""
        torch, dist = self.torch, self.dist
        self.seq += 1
        body = canonical(data)  # the HMAC covers the bytes
        payload = self._mac(phase, self.rank, body) + body
        try:
            sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
            dist.all_gather(sizes, torch.tensor([len(payload)], dtype=torch.int64))
            lengths = [int(s.item()) for s in sizes]
            if not all(32 <= n <= MAX_MESSAGE for n in lengths):
                raise RuntimeFailure(
                    "runtime.distributed.message",
                    f"a rank announced a message of {max(lengths)} bytes in the {phase} exchange; refused",
                    evidence={"phase": phase, "sizes": lengths},
                )
            width = max(lengths)
            mine = torch.zeros(width, dtype=torch.uint8)
            mine[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
            bufs = [torch.empty(width, dtype=torch.uint8) for _ in range(self.world)]
            dist.all_gather(bufs, mine)
        except Error:
            raise
        except Exception as e:  # gloo: connection closed, timeout
            raise _peer_lost(phase, e) from None
        out = []
        for sender, (buf, n) in enumerate(zip(bufs, lengths, strict=True)):
            raw = buf[:n].numpy().tobytes()
            if not hmac.compare_digest(raw[:32], self._mac(phase, sender, raw[32:])):
                raise RuntimeFailure(
                    "runtime.distributed.unauthenticated",
                    f"the {phase} message from rank {sender} does not carry a valid HMAC under "
                    f"this rank's ${SECRET_ENV}; nothing was published",
                    evidence={"phase": phase, "rank": sender},
                    advice=f"Give every rank the same ${SECRET_ENV}, and keep the job's network "
                    "private (docs/scale-out.md).",
                )
            out.append(json.loads(raw[32:]))
        return out


_UNWINDING = threading.Event()  # set once this rank has begun to fail: a later SIGTERM no longer interrupts


class _Terminated(BaseException):
    """SIGTERM (the launcher stopping this rank because another one failed): unwind, cleaning up."""


@contextlib.contextmanager
def _process_group(timeout_s: float) -> Iterator[tuple[Any, Any]]:
    try:
        import torch  # noqa: PLC0415 - the [torch] extra, only for --distributed
        import torch.distributed as dist  # noqa: PLC0415
    except ImportError:
        raise UsageError(
            "usage.distributed.torch_missing",
            "--distributed needs torch (the [torch] extra)",
            advice="pip install 'ckptgate[torch]'",
        ) from None
    if not dist.is_available() or not dist.is_gloo_available():
        raise UsageError(
            "usage.distributed.no_gloo",
            "this torch build has no torch.distributed gloo backend",
            advice=f"Install a torch build with gloo (this one is {torch.__version__}), or take the checkpoint in "
            "without --distributed.",
        )
    try:
        dist.init_process_group("gloo", init_method="env://", timeout=timedelta(seconds=timeout_s))
    except Exception as e:
        raise _peer_lost("rendezvous", e) from None

    def on_term(signum: int, frame: object) -> None:
        if not _UNWINDING.is_set() and not interrupts.past_commit():  # after the rename: published
            _UNWINDING.set()
            raise _Terminated

    _UNWINDING.clear()
    previous = signal.signal(signal.SIGTERM, on_term)
    failed = True
    try:
        yield torch, dist
        failed = False
    except _Terminated:
        raise RuntimeFailure(
            "runtime.distributed.terminated",
            "this rank was stopped (SIGTERM), most likely by "
            "the launcher after another rank failed; nothing was published",
        ) from None
    finally:
        # After a failure the launcher may SIGTERM this rank while it exits: keep its exit code.
        signal.signal(signal.SIGTERM, signal.SIG_IGN if failed else previous)
        with contextlib.suppress(Exception):
            dist.destroy_process_group()


def distributed_intake(
    src: Path,
    dst: Path,
    *,
    attestations: Sequence[Path],
    options: EngineOptions | None = None,
    max_shard_bytes: int = 2 << 30,
    dtype: str | None = None,
    signatures: Sequence[Path] = (),
    key: Path | None = None,
    certificate_chain: Sequence[Path] = (),
    # a Signer or None; Any while _cli/intake_cmd.py passes it as `object` (issue #21)
    receipt_signer: Any = None,
    dist_options: DistributedOptions | None = None,
    select: str | None = None,
) -> IntakeResult | None:
    """Take ``src`` in across the ranks of this torch.distributed job; publish at ``dst`` once.

    Returns the :class:`ckptgate.pipeline.IntakeResult` on rank 0 and ``None`` on the others;
    raises on every rank when any rank fails (see the module's docstring).
    """
    options = options or EngineOptions()
    dist_options = dist_options or DistributedOptions()
    if select is not None:
        raise UsageError(
            "usage.distributed.select",
            "--select is not supported with --distributed yet",
            advice="Drop --select (the policy's default selection still applies), or take the "
            "checkpoint in on one process.",
        )
    secret = _secret()
    _launcher_env()
    with contextlib.ExitStack() as early:
        engine = (  # rank 0 reads --key and --certificate-chain with the trust data, as one process does
            EarlyEngine(options, early, signatures=signatures, key=key, certificate_chain=certificate_chain)
            if os.environ.get("RANK") == "0"
            else None
        )
        with _process_group(dist_options.timeout_s) as (torch, dist):
            comm = TorchGroup(dist, torch, secret)
            comm.start()
            return _run(
                comm,
                src,
                dst,
                attestations=attestations,
                options=options,
                engine=engine,
                max_shard_bytes=max_shard_bytes,
                signatures=signatures,
                key=key,
                certificate_chain=certificate_chain,
                receipt_signer=receipt_signer,
                dtype=dtype,
            )


def _run(comm: Group, src: Path, dst: Path, **kw: Any) -> IntakeResult | None:
    """The phases, then the clean-up of what they opened (the staging directory above all); a
    SIGTERM that arrives once the clean-up has begun is ignored, so it cannot cut it short."""
    with contextlib.ExitStack() as stack:
        try:
            return grouped_intake(comm, stack, src, dst, **kw)
        except BaseException:
            _UNWINDING.set()
            raise
