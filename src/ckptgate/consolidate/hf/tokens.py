"""The published tokenizer's token ids must index rows of the published embedding.

``--hf-config`` publishes the config's tokenizer files beside the mapped weights.  Every id those
files can produce (``tokenizer.json``: its model's vocabulary and its ``added_tokens``;
``vocab.json`` and ``added_tokens.json``: their values) must be a whole number in
``[0, vocab_size)``: an id at or beyond ``vocab_size`` names an embedding row that is not published
(Megatron's padding rows are dropped), so the model would fail, or read garbage, on that token.
A tokenizer for another vocabulary is refused (``hf_config.tokenizer_vocab``, exit 4), never
published beside the weights.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

from ckptgate.errors import InputRejected

__all__ = ["TokenizerMismatch", "check_token_ids"]


class TokenizerMismatch(InputRejected):
    """A tokenizer file of ``--hf-config`` holds ids outside the config's vocabulary: nothing is published."""

    default_advice = (
        "Pass with --hf-config the tokenizer files of the model whose config.json this is (their token ids "
        "must be below its vocab_size), or leave the tokenizer files out."
    )


class _File(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def data(self) -> bytes: ...


def _ids(name: str, doc: Any) -> Iterator[tuple[str, Any]]:
    """``(where, id)`` for every token id ``doc`` (the parsed file ``name``) can produce."""
    if name in ("vocab.json", "added_tokens.json") and isinstance(doc, Mapping):
        yield from ((f"/{k}", v) for k, v in doc.items())
    elif name == "tokenizer.json" and isinstance(doc, Mapping):
        for i, t in enumerate(doc.get("added_tokens") or []):
            yield f"/added_tokens/{i}/id", t.get("id") if isinstance(t, Mapping) else t
        vocab = doc.get("model", {}).get("vocab") if isinstance(doc.get("model"), Mapping) else None
        if isinstance(vocab, Mapping):
            yield from ((f"/model/vocab/{k}", v) for k, v in vocab.items())
        elif isinstance(vocab, list) and vocab:  # Unigram: [token, score] pairs, the id is the position
            yield "/model/vocab (Unigram, by position)", len(vocab) - 1


def check_token_ids(files: Sequence[_File], vocab_size: int) -> None:
    """Refuse (:class:`TokenizerMismatch`) the first tokenizer file holding an id outside ``[0, vocab_size)``."""
    for f in files:
        if f.name not in ("tokenizer.json", "vocab.json", "added_tokens.json"):
            continue
        doc = json.loads(f.data)  # read and checked strictly by the caller
        for where, value in _ids(f.name, doc):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < vocab_size:
                raise TokenizerMismatch(
                    "hf_config.tokenizer_vocab",
                    f"{f.name}: the token id at {where[:120]} is {str(value)[:40]}, outside the config's vocabulary "
                    f"of {vocab_size} (ids 0 to {vocab_size - 1}); the published embedding has no such row",
                    evidence={"file": f.name, "at": where[:200], "id": str(value)[:40], "vocab_size": vocab_size},
                )
