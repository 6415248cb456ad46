"""A static pickle reader: opcode inventory, globals, call sites and a symbolic value.

Nothing is imported, looked up or called.  Opcodes are decoded with :func:`pickletools.genops`
(a decoder that never executes; its ``ValueError`` on a malformed stream becomes a finding and
every finding made before it is kept).  A small symbolic machine replays the stack, the mark
stack and the memo so ``STACK_GLOBAL`` operands are resolved from constants and memo entries
only; anything computed, missing or out-of-band is a finding, never "clean".

Untrusted pickles can execute arbitrary code when loaded [R27]; ``weights_only`` narrows that
risk but is no trust control [R17, R29].  This reader is what lets inspection avoid loading.
"""

from __future__ import annotations

from ckptgate.inspect.allowlist import ALLOWLISTS
from ckptgate.inspect.budget import FileWork
from ckptgate.inspect.findings import error, warning
from ckptgate.inspect.pickle.opcodes import Reader
from ckptgate.inspect.pickle.report import CallSite, PickleLimits, PickleReport, looks_like_pickle
from ckptgate.inspect.pickle.values import Call, Global, PersId, SDict, SList, SSet, Unknown, key_text

__all__ = [
    "Call",
    "CallSite",
    "Global",
    "PersId",
    "PickleLimits",
    "PickleReport",
    "SDict",
    "SList",
    "SSet",
    "Unknown",
    "key_text",
    "looks_like_pickle",
    "read_pickle",
    "refused_report",
]


_LIMITS = PickleLimits()


def refused_report(*, path: str, context: str, size: int, limit: int) -> PickleReport:
    """The report for a pickle refused unread because it exceeds the size cap."""
    f = error("pickle.too_large", path, "pickle stream exceeds the size cap; not read", size=size, limit=limit)
    return PickleReport(
        path=path,
        context=context,
        protocol=None,
        complete=False,
        opcodes={},
        globals=(),
        calls=(),
        findings=(f,),
        inside_allowlist=False,
        plain_tensors=False,
    )


def read_pickle(
    data: bytes,
    *,
    path: str,
    context: str = "tensors",
    limits: PickleLimits = _LIMITS,
    work: FileWork | None = None,
) -> PickleReport:
    """Read one pickle stream statically against the ``context`` allowlist, within ``work``
    (by default a per-file budget for ``len(data)`` bytes, charged to no intake)."""
    allow = ALLOWLISTS[context]
    if len(data) > limits.max_bytes:
        return refused_report(path=path, context=context, size=len(data), limit=limits.max_bytes)
    work = work if work is not None else FileWork(path, len(data))
    r = Reader(data, path, allow, limits, work)
    r.run()
    has_error = any(f.severity == "error" for f in r.findings)
    inside = r.complete and not r.outside and not r.unresolved and not has_error
    tensors = ALLOWLISTS["tensors"]
    plain = inside and all(g in tensors.callables or g in tensors.values for g in r.globals)
    if not r.complete and not r.over_budget and not any(f.code.startswith("pickle.") for f in r.findings):
        r.findings.append(warning("pickle.incomplete", path, "the stream was not read to STOP"))
    return PickleReport(
        path=path,
        context=context,
        protocol=r.protocol,
        complete=r.complete,
        opcodes=dict(r.ops),
        globals=tuple(sorted(r.globals)),
        calls=tuple(r.calls),
        findings=tuple(r.findings),
        inside_allowlist=inside,
        plain_tensors=plain,
        value=r.value if r.complete else None,
        work=work.done,
        tree_units=r.tree_units,
        persistent_ids=tuple(r.persistent_ids),
    )
