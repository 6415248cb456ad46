"""Safety conclusions phrased as impossibility, for the claim model (:mod:`ckptgate.evidence.claimfacts`):
a threat that "cannot" harm the host, or "nothing can"; a control that cannot do something states a limit."""

from __future__ import annotations

import re
from typing import Any

#: Impossibility (a modal negation) and the verbs after it that state a limit of a control, not a
#: safety conclusion ("cannot prove", "cannot make ... safe", "cannot stop a kernel exploit").
_IMPOSSIBLE = re.compile(
    r"\b(?:cannot|can ?not|can't|could not|couldn't|can never|could never|will never|won't|will not|"
    r"is unable to|are unable to|has no way to|have no way to|no way (?:for [\w -]{1,40}? )?to|"
    r"(?:is|it is|it's) impossible (?:for [\w -]{1,40}? )?to)\s+",
    re.IGNORECASE,
)
_NONE_CAN = re.compile(
    r"\b(?:no|nothing|none|not a single|not one)\b\s*(?:[\w-]+\s+){0,3}?(?:can|could|will|would|is able to|"
    r"gets? to|may)\s+(?:ever\s+|possibly\s+)?",
    re.IGNORECASE,
)

_THREAT = re.compile(
    r"\b(?:pickles?|checkpoints?|models?|payloads?|code|attackers?|adversar\w+|loaders?|torch\.load|"
    r"deseriali[sz]\w*|files?|weights|archives?|bundles?|tensors?|objects?|programs?|exploits?|malware|"
    r"it|they|load(?:s|ing)?|inputs?|uploads?|shards?)\b",
    re.IGNORECASE,
)
_CONTROL = re.compile(
    r"\b(?:ckptgate|we|the gate|worker|containment|sandbox|seccomp|namespaces?|rlimits?|cgroups?|signatures?|"
    r"checksums?|digests?|hash(?:es)?|weights_only|reader|inspector|inspection|lint|policy|polic(?:ies)|"
    r"receipt|matrix|filter|controls?|preflight|docs?|page|guide|this|nobody|no one|one)\b",
    re.IGNORECASE,
)
_LIMIT_VERBS = re.compile(
    r"(?:also\s+|itself\s+|alone\s+|on its own\s+|by itself\s+)?(?:prove|make|guarantee|establish|stop|block|"
    r"prevent|detect|replace|tell|say|show|decide|confirm|verify|vouch|ensure|promise|rule out|catch|know|"
    r"see|be (?:trusted|sure|used|proof|a proof|evidence)|substitute|turn|certify"
    r"|(?:be )?qualif|be more than|do more|claim|distinguish|check|read the (?:outside|network))\b",
    re.IGNORECASE,
)


#: What a threat is said to be unable to do, for "cannot" to be a safety conclusion: act on the host,
#: its files, network or secrets, or run code (not "cannot be consolidated", "cannot plan").
_HARM = re.compile(
    r"(?!be\b)(?:\w+\s+)?(?:read|write|open|access|reach|touch|see|run|execute|escape|break out|get out|harm|hurt|"
    r"damage|compromise|exfiltrate|leak|tamper|infect|attack|exploit|contain (?:\w+\s+)?(?:malicious|code|payloads?|"
    r"malware|backdoors?|exploits?)|modify|delete|import|spawn|connect|affect|steal|do (?:any )?(?:harm|damage)|"
    r"take over|call (?:out|home|any)|install)\b",
    re.IGNORECASE,
)


def impossible_facts(masked: str) -> list[dict[str, Any]]:
    """Safety conclusions phrased as impossibility: a threat (a pickle, a checkpoint, a loader, code)
    that "cannot", "has no way to", "will never" do something, or "no code can" / "nothing can".
    A control that cannot do something ("the worker cannot stop a kernel exploit", "a signature
    cannot prove") states a limit, not a safety conclusion."""
    out = []
    for m in _IMPOSSIBLE.finditer(masked):
        head, tail = masked[: m.start()], masked[m.end() :]
        if _LIMIT_VERBS.match(tail) or not _HARM.match(tail):
            continue
        threats = [t.end() for t in _THREAT.finditer(head)]
        controls = [c.end() for c in _CONTROL.finditer(head)]
        if threats and (not controls or max(threats) > max(controls)):
            out.append({"class": "impossible", "term": m.group().strip(), "at": m.start()})
    for m in _NONE_CAN.finditer(masked):
        tail = masked[m.end() :]
        if _LIMIT_VERBS.match(tail) or not _HARM.match(tail) or _CONTROL.search(masked[m.start() : m.end()]):
            continue
        if _THREAT.search(masked[m.start() : m.end()]) or re.match(r"nothing\b", m.group(), re.IGNORECASE):
            out.append({"class": "impossible", "term": m.group().strip(), "at": m.start()})
    return out
