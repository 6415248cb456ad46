"""Entry-name rules of the zip check: canonical names, and distinct names one reader could confuse.

:func:`name_collisions` reports two distinct names that fold to one key under case folding, Unicode
normalisation or path normalisation (each fold a reader applies, alone and all together);
``_canonical`` refuses empty, ``.`` and ``..`` path segments.  Used by
:mod:`ckptgate.inspect.zipcheck` on the central directory's names.
"""

from __future__ import annotations

import posixpath
import unicodedata
from collections.abc import Callable

__all__ = ["name_collisions"]


#: Ways two distinct entry names can name one file for some reader.  miniz (torch's reader) folds
#: ASCII case; file systems and other zip readers fold Unicode case, compose or compatibility-
#: normalise, or normalise paths.  ``casefold`` covers miniz's ASCII folding: two names that differ
#: only by ASCII case have the same ``casefold``.
def _path_fold(name: str) -> str:
    return posixpath.normpath("/" + name.replace("\\", "/")).lstrip("/")


_FOLDS: tuple[tuple[str, Callable[[str], str]], ...] = (
    ("case", str.casefold),
    ("nfc", lambda n: unicodedata.normalize("NFC", n)),
    ("nfkc", lambda n: unicodedata.normalize("NFKC", n)),
    ("path", _path_fold),
    ("combined", lambda n: _combined(n)),
)


def _combined(name: str) -> str:
    """Every fold at once, to a fixed point: NFKC can make a ``/`` or ``.`` (U+FF0F, U+FE52) that
    path folding then removes, and case folding can un-normalise."""
    for _ in range(4):
        k = _path_fold(unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", name).casefold()))
        if k == name:
            break
        name = k
    return name


def name_collisions(names: list[str] | tuple[str, ...]) -> list[tuple[str, str, str]]:
    """``(fold, first, second)`` for each pair of distinct names that a fold maps to the same key,
    named by the first fold that does (exact duplicates are left to the caller)."""
    out: list[tuple[str, str, str]] = []
    pairs: set[tuple[str, str]] = set()
    distinct = list(dict.fromkeys(names))
    for fold, f in _FOLDS:
        seen: dict[str, str] = {}
        for n in distinct:
            other = seen.setdefault(f(n), n)
            if other != n and (other, n) not in pairs:
                pairs.add((other, n))
                out.append((fold, other, n))
    return out


def _canonical(name: str) -> bool:
    """No empty, ``.`` or ``..`` segment: no ``a//b``, ``a/./b``, leading or trailing slash
    (a directory entry).  torch's writer never produces one; readers normalise them differently."""
    return all(seg not in ("", ".", "..") for seg in name.split("/"))
