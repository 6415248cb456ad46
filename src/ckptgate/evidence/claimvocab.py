"""The claims vocabulary (policy data ``config/claims/data.json``) as the claim model reads it:
system aliases longest first, producers, kinds, families and the lexicon's patterns."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any


@dataclass(frozen=True)
class Vocabulary:
    """The claims policy data (``config/claims/data.json``): systems, producers and the lexicon."""

    data: Mapping[str, Any]

    @cached_property
    def lexicon(self) -> Mapping[str, Any]:
        return self.data.get("lexicon") or {}

    def rx(self, *path: str) -> re.Pattern[str]:
        node: Any = self.lexicon
        for p in path:
            node = node[p]
        return _compile(node)

    @cached_property
    def aliases(self) -> list[tuple[re.Pattern[str], str, str]]:
        """(pattern, system id, alias), longest alias first."""
        out = []
        for sid, entry in (self.data.get("systems") or {}).items():
            for alias in entry.get("aliases") or []:
                exact = alias.startswith("=") or len(alias) <= 3
                text = alias.lstrip("=")
                flags = 0 if exact else re.IGNORECASE
                body = re.escape(text).replace(r"\ ", r"[\s_-]+")
                # a name ends before "/" only when a number list follows ("ZeRO-1/2/3"), not a path ("a/b")
                pat = re.compile(r"(?<![\w./-])" + body + r"(?![\w-]|/(?!\d+\b)|\.\w)", flags)
                out.append((pat, sid, text))
        out.sort(key=lambda t: -len(t[2]))
        return out

    @cached_property
    def producers(self) -> list[tuple[re.Pattern[str], str]]:
        out = []
        for pid, names in (self.data.get("producers") or {}).items():
            for n in names:
                out.append((re.compile(r"(?<![\w./-])" + re.escape(n) + r"(?![\w/-])", re.IGNORECASE), pid))
        return out

    @cached_property
    def system_producers(self) -> list[tuple[re.Pattern[str], str]]:
        """(pattern, producer) for each alias of a system whose producer is a known producer name:
        "DCP 2.9" names a torch release, "Megatron 0.20" a megatron-core one."""
        known = set(self.data.get("producers") or {})
        systems = self.data.get("systems") or {}
        return [
            (pat, systems[sid]["producer"]) for pat, sid, _ in self.aliases if systems[sid].get("producer") in known
        ]

    @cached_property
    def alias_ids(self) -> dict[str, str]:
        """Each alias, lower-case, to its system id (the first, longest-first, when two share one)."""
        out: dict[str, str] = {}
        for _, sid, alias in self.aliases:
            out.setdefault(alias.lower(), sid)
        return out

    def is_alias(self, text: str) -> bool:
        """Whether ``text`` is, in full, the name of a system."""
        return any(pat.fullmatch(text) for pat, _, _ in self.aliases)

    @cached_property
    def kinds(self) -> dict[str, str]:
        return {sid: str(e.get("kind")) for sid, e in (self.data.get("systems") or {}).items()}

    def related(self, variant: str, family: str) -> bool:
        """Whether ``family`` is an ancestor or the producer framework of ``variant``."""
        systems = self.data.get("systems") or {}
        seen: set[str] = set()
        sid: str | None = variant
        while sid and sid not in seen:
            seen.add(sid)
            entry = systems.get(sid) or {}
            if sid != variant and sid == family:
                return True
            if (
                entry.get("producer")
                and entry.get("producer") == (systems.get(family) or {}).get("producer")
                and self.kinds.get(family) == "framework"
            ):
                return True
            sid = entry.get("family")
        return False

    @cached_property
    def non_systems(self) -> set[str]:
        return {s.lower() for s in self.data.get("non_systems") or []}

    @cached_property
    def alias_words(self) -> set[str]:
        return {a.lower() for _, _, a in self.aliases}


_CACHE: dict[str, re.Pattern[str]] = {}


def _compile(p: str) -> re.Pattern[str]:
    if p not in _CACHE:
        _CACHE[p] = re.compile(p, re.IGNORECASE)
    return _CACHE[p]
