"""Per-file facts: classification plus the matching structural reader for each kind."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from dataclasses import dataclass
from typing import Any

from ckptgate._json import JSONRejected, loads_strict
from ckptgate.errors import InputRejected
from ckptgate.inspect.budget import WorkBudget
from ckptgate.inspect.classify import FileKind, classify_file
from ckptgate.inspect.coderefs import code_reference_findings
from ckptgate.inspect.findings import Finding, error, info, warning
from ckptgate.inspect.hashed import HashedFile
from ckptgate.inspect.pickle import PickleLimits, PickleReport, read_pickle, refused_report
from ckptgate.inspect.roles import (
    MAX_TOKENIZER_MODEL,
    RESUME_CONTEXT,
    companion_ok,
    resume_content_ok,
    resume_state_name,
)
from ckptgate.inspect.safetensors import SafetensorsHeader, read_header
from ckptgate.inspect.torchzip import TorchZipLayout, inspect_torch_zip
from ckptgate.inspect.walk import SafeTree
from ckptgate.inspect.zipcheck import CrcMode, check_zip

__all__ = ["SIBLING_CONTEXTS", "FileFacts", "analyse_file", "pickle_context"]

MAX_JSON = 64 << 20
MAX_TEXT = 1 << 20
_DS = re.compile(r"(^|/)(bf16_)?(zero_pp_rank_\d+_)?mp_rank_\d+_(model|optim)_states\.pt$", re.ASCII)
_NPY_DESCR = re.compile(rb"'descr'\s*:\s*'([^']*)'")
#: Pickle contexts a file gets from a sibling (``metadata.json`` beside it), not from itself: wider
#: allowlists that hold only where the detected format claims the file as its own (inspection.py).
SIBLING_CONTEXTS = frozenset({"megatron_common", "megatron_dcp_metadata"})


@dataclass(frozen=True, slots=True, kw_only=True)
class FileFacts:
    path: str
    size: int
    kind: FileKind
    detail: str
    safetensors: SafetensorsHeader | None = None
    json: Any = None
    text: str | None = None
    torch: TorchZipLayout | None = None
    pickle: PickleReport | None = None
    #: "companion" (pure data that travels with the model when policy allows), "resume_state"
    #: (training state, inspected and reported, never planned or published), or None
    role: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = {"path": self.path, "kind": str(self.kind), "size": self.size, "detail": self.detail}
        if self.role is not None:
            out["role"] = self.role
        return out


def pickle_context(path: str) -> str:
    base = os.path.basename(path)
    if base == ".metadata" or re.fullmatch(r"__\d+\.metadata", base, re.ASCII):
        return "dcp_metadata"
    if _DS.search(path) or re.search(r"(^|/)zero/optimizer_state\.pt$", path):
        return "deepspeed"
    return "tensors"


def analyse_file(
    tree: SafeTree,
    path: str,
    *,
    verify_crc: CrcMode = True,
    work: WorkBudget | None = None,
    sibling_contexts: bool = True,
) -> tuple[FileFacts, list[Finding]]:
    """Open ``path`` through the tree, classify it and run the reader for its kind; a pickle in it
    is read within its own budget and ``work``, the whole tree's (:mod:`.budget`).  With
    ``sibling_contexts`` false, a :data:`SIBLING_CONTEXTS` context is never chosen."""
    entry = tree.entry(path)
    assert entry is not None
    ctx = pickle_context(path)
    folder = path.rsplit("/", 1)[0] + "/" if "/" in path else ""
    megatron = sibling_contexts and tree.entry(folder + "metadata.json") is not None
    if ctx == "dcp_metadata" and megatron:
        ctx = "megatron_dcp_metadata"
    if os.path.basename(path) == "common.pt" and megatron:
        ctx = "megatron_common"  # Megatron-LM's common state: args (a Namespace) and enums, read as data
    if resume_state_name(
        path,
        lambda rel: tree.entry(rel) is not None,
        lambda d: [
            e.path.rsplit("/", 1)[-1] for e in tree.entries if (e.path.rsplit("/", 1)[0] if "/" in e.path else "") == d
        ],
    ):
        ctx = RESUME_CONTEXT
    with tree.reader(path) as src:
        facts, findings = _analyse(src, entry.size, path, verify_crc, ctx, work)
        return _role(src, facts, findings, ctx)


def _role(src: HashedFile, facts: FileFacts, findings: list[Finding], ctx: str) -> tuple[FileFacts, list[Finding]]:
    """Give a companion or a resume-state file its role, once its content matches its name."""
    if ctx == RESUME_CONTEXT:
        rep = facts.pickle
        if rep is None or not resume_content_ok(facts.path, rep.value):
            findings.append(
                error(
                    "resume_state.content_mismatch",
                    facts.path,
                    "named and placed as training resume state, but its content is not what a "
                    "producer writes under this name; it is not excluded",
                    kind=str(facts.kind),
                )
            )
            return facts, findings
        findings.append(
            info(
                "resume_state.excluded",
                facts.path,
                "training resume state: inspected statically, reported, never loaded or published",
                globals=len(rep.globals),
            )
        )
        return dataclasses.replace(facts, role="resume_state"), findings

    if facts.path.rsplit("/", 1)[-1] == "trainer_state.json" and isinstance(facts.json, dict):
        best = facts.json.get("best_model_checkpoint")
        if isinstance(best, str) and (best.startswith("/") or ".." in best.replace("\\", "/").split("/")):
            # the Trainer records where it kept its best checkpoint; ckptgate never follows it
            findings.append(
                warning(
                    "trainer_state.best_checkpoint_outside",
                    facts.path,
                    "best_model_checkpoint points outside the checkpoint; it is recorded, never followed",
                    best_model_checkpoint=best[:200],
                )
            )

    def read() -> bytes | None:
        return src.pread(facts.size, 0) if facts.size <= MAX_TOKENIZER_MODEL else None

    ok = companion_ok(facts.path, facts.kind, facts.json, read)
    if ok is None:
        return facts, findings
    if not ok:
        if any(f.severity == "error" for f in findings):  # already refused for what it is; one finding says it
            return facts, findings
        findings.append(
            error(
                "companion.content_mismatch",
                facts.path,
                f"named like a model companion, but the content ({facts.kind}) is not what that file holds",
                kind=str(facts.kind),
            )
        )
        return facts, findings
    return dataclasses.replace(facts, role="companion"), findings


def _analyse(
    src: HashedFile, size: int, path: str, verify_crc: CrcMode, pctx: str, work: WorkBudget | None = None
) -> tuple[FileFacts, list[Finding]]:
    c = classify_file(src, size, path)
    findings = list(c.findings)
    kw: dict[str, Any] = {}
    k = c.kind
    ext = os.path.splitext(path)[1].lower()
    if k == FileKind.SAFETENSORS or (
        ext == ".safetensors" and k in (FileKind.UNKNOWN, FileKind.TEXT, FileKind.JSON, FileKind.EMPTY)
    ):
        try:
            kw["safetensors"] = read_header(src, size, path=path)
        except InputRejected as e:
            findings.append(error(e.code, path, e.message, **{k2: v for k2, v in e.evidence.items() if k2 != "path"}))
    elif k == FileKind.JSON:
        if size > MAX_JSON:
            findings.append(error("json.too_large", path, "JSON file exceeds the size cap", size=size))
        else:
            raw = src.pread(size, 0)
            try:
                kw["json"] = loads_strict(raw, what="JSON file")
            except JSONRejected as r:
                if r.kind == "too_deep":
                    findings.append(error("json.too_deep", path, "JSON nests deeper than the cap"))
                elif r.kind == "duplicate_key":
                    findings.append(
                        error("json.duplicate_key", path, f"duplicate JSON key {str(r.detail['key'])[:80]!r}")
                    )
                else:
                    findings.append(error("json.invalid", path, f"invalid JSON: {r.reason[:200]}"))
            if "json" in kw:  # auto_map, custom_pipelines or a repo--module.Class string, at any depth
                findings.extend(code_reference_findings(path, kw["json"]))
    elif k == FileKind.TEXT and size <= MAX_TEXT:
        kw["text"] = src.pread(size, 0).decode("utf-8", "replace")
    elif k == FileKind.TORCH_ZIP:
        layout, f = inspect_torch_zip(src, size, path=path, context=pctx, verify_crc=verify_crc, work=work)
        findings.extend(f)
        kw["torch"] = layout
        kw["pickle"] = layout.pickle if layout else None
    elif k == FileKind.PICKLE:
        cap = PickleLimits().max_bytes
        if size > cap:  # refused before anything is read into memory
            rep = refused_report(path=path, context=pctx, size=size, limit=cap)
        else:
            rep = read_pickle(
                src.pread(size, 0), path=path, context=pctx, work=work.file(path, size) if work is not None else None
            )
        findings.extend(rep.findings)
        kw["pickle"] = rep
        if not pctx.endswith("dcp_metadata"):
            findings.append(
                error("classify.raw_pickle", path, "a raw pickle (not a torch zip) needs an unpickler to load")
            )
    elif k == FileKind.LEGACY_TORCH:
        findings.append(
            error(
                "classify.legacy_torch",
                path,
                "legacy torch serialization (tar or raw pickle with the magic number) needs torch.load to read",
            )
        )
    elif k == FileKind.TORCHSCRIPT:
        findings.append(error("torch.torchscript_archive", path, "a TorchScript archive is a program, not weights"))
    elif k == FileKind.ARCHIVE:
        findings.append(
            error("classify.archive", path, f"an archive ({c.detail}) around checkpoint data is not unpacked; refused")
        )
    elif k == FileKind.NUMPY:
        m = _NPY_DESCR.search(src.pread(min(size, 4096), 0))
        if m is None or b"O" in m.group(1):
            findings.append(error("numpy.object_dtype", path, "npy with object dtype (pickled) or no descr"))
    elif k == FileKind.NPZ:
        zr = check_zip(src, size, path=path, verify_crc=bool(verify_crc))  # a plain zip: checked now
        findings.extend(zr.findings)
        findings.append(warning("numpy.npz", path, "npz members are not validated further"))
    elif k == FileKind.ZIP_STREAM and ext != ".distcp":
        findings.append(
            error(
                "classify.zip_stream",
                path,
                "zip data whose central directory cannot be read (concatenated, truncated or malformed zips); refused",
            )
        )
        findings.extend(check_zip(src, size, path=path, verify_crc=False).findings)  # what is wrong with it
    elif k == FileKind.UNKNOWN:
        findings.append(warning("classify.unknown", path, "content of unknown type"))
    if ext == ".json" and "json" not in kw:
        if size <= MAX_JSON:
            findings.extend(_loader_code_references(src, size, path))
        elif k != FileKind.JSON:  # too large to read for code references, whatever it sniffs as
            findings.append(error("json.too_large", path, "JSON file exceeds the size cap", size=size))
    return FileFacts(path=path, size=size, kind=k, detail=c.detail, **kw), findings


def _loader_code_references(src: HashedFile, size: int, path: str) -> list[Finding]:
    """Code references in a ``.json`` file that the strict reader did not parse (its content sniffed
    as another kind, or refused by the strict parser), read the way transformers reads a companion:
    ``json.loads`` of its UTF-8 text, which takes leading white space past any sniffing window,
    duplicate keys (the last wins) and ``NaN``.  The file is refused for what it is already; this
    names the code it carries, so that no exception of its other findings can publish it."""
    try:
        doc = json.loads(src.pread(size, 0).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return []
    return code_reference_findings(path, doc)
