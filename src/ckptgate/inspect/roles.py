"""File roles beside the model: pure-data companions and training resume state.

*Companions* are the files a user needs to load a published model (``config.json``,
``generation_config.json``, the tokenizer files). They are pure data, checked here by content,
and copied byte for byte when the policy lets them travel.

*Resume state* is what a training run writes to continue itself: a Hugging Face ``Trainer``
``checkpoint-N/`` folder (marked by ``trainer_state.json``) holds ``optimizer.pt``,
``scheduler.pt``, ``scaler.pt``, ``rng_state*.pth`` and ``training_args.bin``; an Accelerate
``save_state`` folder (marked by ``random_states_N.pkl``) holds ``optimizer*.bin``,
``scheduler*.bin``, ``scaler.pt`` and ``random_states_N.pkl`` [R19, R20]. A file gets this role
by layout (its name, in a folder with the marker) *and* by content (what its pickle's root value
is, read statically): a model state dict named ``optimizer.pt`` is not resume state, and is an
error. Resume state is inspected against its own allowlist, reported, and never planned, loaded
or published.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable
from typing import Any

from ckptgate.inspect.classify import FileKind
from ckptgate.inspect.pickle import Call, Global, SDict

__all__ = ["COMPANIONS", "RESUME_CONTEXT", "companion_ok", "resume_content_ok", "resume_state_name"]

RESUME_CONTEXT = "resume_state"
MAX_TOKENIZER_MODEL = 64 << 20

_TRAINER_FILES = re.compile(
    r"^(optimizer\.pt|scheduler\.pt|scaler\.pt|rng_state(_\d+)?\.pth|training_args\.bin)$", re.ASCII
)
_ACCELERATE_FILES = re.compile(
    r"^(optimizer(_\d+)?\.bin|scheduler(_\d+)?\.bin|scaler\.pt|random_states_\d+\.pkl)$", re.ASCII
)
_ACCELERATE_MARK = re.compile(r"^random_states_\d+\.pkl$", re.ASCII)
_RNG_KEYS = frozenset({"python", "numpy", "cpu", "cuda", "mps", "xpu", "npu", "hpu", "mlu", "musa"})
_TRAINING_ARGS = frozenset(
    {"transformers.training_args.TrainingArguments", "transformers.training_args_seq2seq.Seq2SeqTrainingArguments"}
)


def resume_state_name(path: str, siblings: Callable[[str], bool], names: Callable[[str], list[str]]) -> bool:
    """Whether ``path`` sits where resume state is written: its name in a Trainer folder (with
    ``trainer_state.json``) or an Accelerate folder (with a ``random_states_N.pkl``).
    ``siblings(rel)`` says whether a file exists; ``names(folder)`` lists a folder's basenames."""
    folder, base = posixpath.split(path)
    prefix = folder + "/" if folder else ""
    if _TRAINER_FILES.match(base) and siblings(prefix + "trainer_state.json"):
        return True
    return bool(_ACCELERATE_FILES.match(base)) and any(_ACCELERATE_MARK.match(n) for n in names(folder))


def _keys(value: Any) -> set[str] | None:
    if isinstance(value, SDict):
        return {k for k, _ in value.items if isinstance(k, str)}
    return None


def resume_content_ok(path: str, value: Any) -> bool:
    """Whether the statically read root ``value`` is what a producer writes under this name."""
    base = posixpath.basename(path)
    keys = _keys(value)
    if base == "training_args.bin":
        return isinstance(value, Call) and isinstance(value.func, Global) and value.func.dotted in _TRAINING_ARGS
    if keys is None:
        return False
    if base.startswith("optimizer"):
        return keys == {"state", "param_groups"}  # torch.optim.Optimizer.state_dict()
    if base.startswith("scheduler"):
        return "last_epoch" in keys  # torch.optim.lr_scheduler.LRScheduler.state_dict()
    if base == "scaler.pt":
        return "scale" in keys  # torch.amp.GradScaler.state_dict()
    if base.startswith("rng_state"):
        return bool(keys) and keys <= _RNG_KEYS and "python" in keys
    if base.startswith("random_states_"):
        return "random_state" in keys  # accelerate.checkpointing.save_accelerator_state
    return False


# -- companions ----------------------------------------------------------------------------------
def _json_object(kind: FileKind, doc: Any, _read: Callable[[], bytes | None]) -> bool:
    return kind == FileKind.JSON and isinstance(doc, dict)


def _tokenizer_model(kind: FileKind, _doc: Any, read: Callable[[], bytes | None]) -> bool:
    """A SentencePiece ``ModelProto`` (protobuf wire format, from its first byte to its last) or a
    tiktoken rank file (``<base64> <rank>`` lines), nothing else."""
    if kind not in (FileKind.UNKNOWN, FileKind.TEXT):
        return False
    raw = read()
    if not raw:
        return False
    return _protobuf(raw) or _tiktoken(raw)


def _varint(b: bytes, i: int) -> tuple[int, int]:
    n = shift = 0
    while True:
        if i >= len(b) or shift > 63:
            raise ValueError
        c = b[i]
        i += 1
        n |= (c & 0x7F) << shift
        shift += 7
        if not c & 0x80:
            return n, i


def _protobuf(b: bytes) -> bool:
    i = 0
    try:
        while i < len(b):
            tag, i = _varint(b, i)
            field, wire = tag >> 3, tag & 7
            if field == 0:
                return False
            if wire == 0:
                _, i = _varint(b, i)
            elif wire == 1:
                i += 8
            elif wire == 2:
                n, i = _varint(b, i)
                i += n
            elif wire == 5:
                i += 4
            else:
                return False
    except ValueError:
        return False
    return i == len(b)


_TIKTOKEN_LINE = re.compile(rb"^[A-Za-z0-9+/]+={0,2} \d+$")


def _tiktoken(b: bytes) -> bool:
    lines = b.rstrip(b"\n").split(b"\n")
    return bool(lines) and all(_TIKTOKEN_LINE.match(ln) for ln in lines)


#: name -> content check. Only files at the top of the checkpoint are companions.
COMPANIONS: dict[str, Callable[[FileKind, Any, Callable[[], bytes | None]], bool]] = {
    "config.json": _json_object,
    "generation_config.json": _json_object,
    "tokenizer.json": _json_object,
    "tokenizer_config.json": _json_object,
    "special_tokens_map.json": _json_object,
    "tokenizer.model": _tokenizer_model,
}


def companion_ok(path: str, kind: FileKind, doc: Any, read: Callable[[], bytes | None]) -> bool | None:
    """None when ``path`` is not a companion's name at the top; else whether its content passes."""
    check = COMPANIONS.get(path)
    return None if check is None else check(kind, doc, read)
