"""The claim model: rule-based claim facts for one sentence, for the ``ckptgate.claims`` policy to judge.

Python extracts, Rego decides.  A sentence is split into clauses (at ``;``, ``:``, dashes and
conjunctions such as ``, but`` / ``, so`` / ``which``); in each clause the extractor finds

* **systems**: mentions of formats, frameworks, their variants (ZeRO stages, FSDP generations,
  Megatron Bridge, ...) and tools, longest alias first, from the vocabulary in policy data
  (``data.ckptgate.config.claims.systems``); producer **versions** written after a producer name
  (``torch 2.13.0``, ``DeepSpeed 0.14 and later``), open-ended or not;
* **capability predicates** (support, load, consolidate, convert, read, handle, work with,
  compatible, accept), each with its polarity (a negation before it in the clause), voice, and the
  clause's **agent**: ``project`` (ckptgate, we, intake, the adapters ...), ``vendor`` (vendor
  phrasing such as "documents", or a vendor tool as the active subject) or ``implicit``;
* **safety predicates** (safe, harmless, cannot harm, protects, prevents ..., proves/guarantees
  safety, trust surrogates called sufficient or trusted), each with its polarity; "cannot harm"
  is a safety claim, not a negation;
* **topics** (trust surrogates, signatures, containment, OS controls, loaders), **bounding cues**
  (scope limited to matrix rows, universal quantifiers, cross-platform cues, platform bounds,
  hypotheticals) and **unknown** system-like names.

Quoted text (between double quotation marks, or three words or more between single ones) is a
mention, not a claim, and is blanked before analysis.  The facts are plain JSON; nothing here decides a violation.
"""

from __future__ import annotations

import re
from typing import Any

from ckptgate.evidence.claim_impossible import impossible_facts
from ckptgate.evidence.claimvocab import Vocabulary

_CLAUSE = re.compile(
    r"\s*;\s*|:\s+(?!(?:false|no|none|null)\b)|\s+[\u2014\u2013]\s+|\s+--?\s+|\s*\u2014\s*"
    r"|,\s*(?=(?:but|and|so|while|whereas|yet|though|although|because|since|which|whereby|hence|thus|"
    r"therefore|however|so that)\b)"
    r"|\s+(?=(?:but|whereas|although|though|because|however|therefore)\b)|\s+\|\s+",
    re.IGNORECASE,
)
_PAREN = re.compile(r"\(([^()]*)\)")
_QUOTED = re.compile(r"[\"\u201c]([^\"\u201d]+?)[\"\u201d]|(?<!\w)'([^']{3,}?)'(?!\w)")
_CAND = re.compile(
    r"(?<![\w./-])(?:[A-Z][a-z]+[A-Z][\w-]*|[A-Z]{2,}[\w+-]*|[A-Za-z]+-?\d[\w.-]*|[A-Z][a-z]{2,}\w*)"
    r"(?![\w/]|\.\w|\(|::)"
)
#: Inline code (``x`` or `x`): code, not prose; a name in it is an identifier, never an unknown system.
_CODE = re.compile(r"(`+)[^`]+?\1")
#: A name alone in parentheses ("(LoadedTrees)") refers to an identifier.
_PAREN_NAME = re.compile(r"\(\s*[A-Za-z_][\w.]*\s*\)")
#: A capability predicate that ends in a preposition of place ("runs on", "deployed in"): its claim is its object.
_LOCATIVE = re.compile(r"\b(?:on|under|across|inside|in)$", re.IGNORECASE)
_VERSION = re.compile(
    r"\s*(?:(?:versions?|releases?)\s+|v(?=\d))?((?:from|since|>=|\u2265|>|starting (?:with|at)|at least)\s*)?"
    r"(?:version\s+|v(?=\d))?(\d+(?:\.\d+){0,2}(?:\.x|\.\*)?)"
)
#: The rest of a version list or range after its first version: "2.10 to 2.15", "0.17.6, 0.18.9 and 0.19.8".
_MORE_VERSIONS = re.compile(
    r"\s*(?:to|through|thru|until|up to|-|\u2013|and|or|,|, and|, or)\s*(?:v(?=\d))?(\d+\.\d+(?:\.\d+)?(?:\.x|\.\*)?)"
)


def _mask(text: str, spans: list[tuple[int, int]]) -> str:
    chars = list(text)
    for a, b in spans:
        for i in range(a, b):
            chars[i] = " " if chars[i] != "\n" else "\n"
    return "".join(chars)


def clauses(text: str) -> list[str]:
    return [c for c, _ in _split(text)]


def _split(text: str) -> list[tuple[str, str]]:
    """The clauses of ``text``, each with the delimiter that ends it ("" for the last)."""
    out: list[tuple[str, str]] = []
    at = 0
    for m in _CLAUSE.finditer(text):
        if m.start() == m.end() and m.start() == at:
            continue
        part = text[at : m.start()]
        if part.strip():
            out.append((part, m.group().strip()))
        at = m.end()
    if text[at:].strip():
        out.append((text[at:], ""))
    return out or [(text, "")]


#: A label's delimiter: what follows it is the label's value ("ZeRO-1: supported", "| ZeRO-1 | yes |").
_LABEL = re.compile(r"^(?::|\||[\u2014\u2013]|--?|\?)$")


def _fragments_take_their_predicate(vocab: Vocabulary, facts: list[dict[str, Any]], delims: list[str]) -> None:
    """A clause that only lists systems, producer versions or other names ("ZeRO-1, FSDP2 and NeMo",
    "and ZeRO-1 ones too", "DeepSpeed 0.18.0", "macOS") has no predicate of its own: it is the object
    or subject of its neighbour's.  A label ("ZeRO-1: supported",
    a table cell) takes the next clause's capability predicate; a list after one ("Supported formats:
    ZeRO-1, FSDP2", "supports ZeRO-2, and ZeRO-1 too") the previous one's, with its polarity."""
    for i, c in enumerate(facts):
        named = [s["term"] for s in c["systems"]] + [v["term"] for v in c["versions"]]
        named += [e["term"] for e in c["entities"] if e["kind"] in ("name", "platform")]
        if not named or c["capability"] or c["safety"] or c["negation"] or c["vendor_phrasing"]:
            continue
        rest = c["text"]
        for term in sorted(named, key=len, reverse=True):  # "DeepSpeed 0.18.0", "macOS", as well as systems
            rest = rest.replace(term, " ")
        if vocab.rx("fragment_filler").sub(" ", rest).strip(" \t.,;:=|!?*_()[]'\"\u2019\u2192\u21d2\u27f6->"):
            continue
        nxt = facts[i + 1] if i + 1 < len(facts) else None
        if _LABEL.match(delims[i]):
            source = [nxt] if nxt is not None else []
        else:
            source = [f for f in reversed(facts[:i]) if f["capability"]][:1]
        if (re.search(r"[:=\u2705\u2713\u2714\u2611\u2192\u21d2\u27f6]|->", rest) and _affirmed(vocab, rest)) or (
            delims[i] != "|" and _LABEL.match(delims[i]) and nxt is not None and _affirmed(vocab, nxt["text"])
        ):  # "FSDP2: yes", "FSDP2 = true", "ZeRO-1 \u2705", "ZeRO-1? Yes.": the value affirms the label
            source = [{"capability": [_AFFIRMED]}]
        if source and source[0]["capability"]:
            c["capability"] = [dict(p) for p in source[0]["capability"]]
            c["inherited"] = True
            for sys in c["systems"]:
                sys["object"] = True


#: What an affirmed label claims ("FSDP2: yes"): that the system is supported.
_AFFIRMED = {"class": "support", "term": "yes", "passive": True, "negated": False, "agent": "implicit"}


def _affirmed(vocab: Vocabulary, text: str) -> bool:
    """Whether ``text`` is, in full, an affirmation ("yes", "true", "\u2713", "Yes, fully."), with
    a label's "=", ":" or arrow before it.  In a table a cell is read with its column header instead."""
    return bool(vocab.rx("affirmation").match(_LABEL_MARK.sub("", text)))


#: What joins a label to its value: "FSDP2: yes", "FSDP2 = yes", "FSDP2 -> yes", "FSDP2 \u2192 yes".
_LABEL_MARK = re.compile(r"^(?:[\s:=]|->|=>|[\u2192\u21d2\u27f6])+")


def _systems(vocab: Vocabulary, clause: str) -> tuple[list[dict[str, Any]], str]:
    """Mentions of vocabulary systems (longest alias first), and the clause with them blanked."""
    found: list[dict[str, Any]] = []
    masked = clause
    for pat, sid, _alias in vocab.aliases:
        for m in pat.finditer(masked):
            found.append({"id": sid, "term": clause[m.start() : m.end()], "at": m.start()})
            masked = masked[: m.start()] + "\0" * (m.end() - m.start()) + masked[m.end() :]
    found.sort(key=lambda f: f["at"])
    found = _number_lists(vocab, clause, found)
    kept = []
    after_rx = vocab.rx("artifact_after")
    for f in found:
        end = f["at"] + len(f["term"])
        f["artifact"] = bool(after_rx.match(clause[end:]))
    for i, f in enumerate(found):  # a family or producer written right before its variant: "DeepSpeed ZeRO-2"
        nxt = found[i + 1] if i + 1 < len(found) else None
        end = f["at"] + len(f["term"])
        if (
            nxt is not None
            and vocab.kinds.get(f["id"]) in ("family", "framework")
            and not clause[end : nxt["at"]].strip(" '\u2019s")
            and vocab.related(nxt["id"], f["id"])
        ):
            continue
        if _VERSION.match(clause, end) and vocab.kinds.get(f["id"]) in ("family", "framework") and not f.get("listed"):
            continue  # "torch 2.13.0" names a producer version, reported under versions
        kept.append(f)
    return kept, masked


#: Numbers after a family or a numbered variant: "ZeRO-1/2/3", "ZeRO stages 1-3", "ZeRO 1, 2 and 3",
#: "FSDP v1/v2".  A range ("1-3", "1 to 3", "1 through 3") names every number in it.
_NUMBERS = re.compile(
    r"(?:[\s-]*(?:stages?|v)?[\s-]*\d+\b)?(?:\s*(?:/|,|,?\s*and|,?\s*or|to|through|thru|-|\u2013)\s*(?:stage\s*|v)?\d+\b)+",
    re.IGNORECASE,
)
_RANGE_WORD = re.compile(r"^\s*(?:to|through|thru|-|\u2013)\s*$", re.IGNORECASE)


def _number_lists(vocab: Vocabulary, clause: str, found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each variant a number list after a family or numbered variant names ("ZeRO-1/2/3": ZeRO-1,
    ZeRO-2 and ZeRO-3), found by looking up "<family> <n>" among the aliases."""
    out: list[dict[str, Any]] = []
    for f in found:
        out.append(f)
        end = f["at"] + len(f["term"])
        m = _NUMBERS.match(clause, end)
        if not m or vocab.kinds.get(f["id"]) not in ("family", "variant"):
            continue
        root = re.sub(r"(?:[\s-]*(?:stages?|v)?[\s-]*\d+|[\s-]*stages?)$", "", f["term"], flags=re.IGNORECASE)
        own = re.search(r"(\d+)$", f["term"])
        text = (own.group(1) if own else "") + m.group()
        nums = [int(n) for n in re.findall(r"\d+", text)]
        seps = re.split(r"(?:stage\s*|v)?\d+", text, flags=re.IGNORECASE)[1:-1]
        names: list[int] = []
        for i, n in enumerate(nums):
            if i and _RANGE_WORD.match(seps[i - 1]) and 0 < n - nums[i - 1] <= 8:
                names.extend(range(nums[i - 1] + 1, n + 1))
            else:
                names.append(n)
        ids = [vocab.alias_ids.get(f"{root} {n}".lower()) for n in names]
        if len(names) < 2 or not all(ids):
            continue
        out.pop()
        for n, sid in zip(names, ids, strict=True):
            out.append({"id": sid, "term": f"{root} {n}", "at": f["at"], "listed": True})
    return out


def _versions(vocab: Vocabulary, clause: str) -> list[dict[str, Any]]:
    """Producer versions: a producer name followed by a version (``torch 2.13.0``), or a system whose
    producer the vocabulary knows followed by a dotted version (``DCP 2.9``, ``Megatron 0.20``: the
    producer's release, not a stage or generation such as ``ZeRO 3`` or ``FSDP 2``)."""
    out = []
    open_rx = vocab.rx("version_open")
    ends: set[int] = set()
    named = [(pat, pid, False) for pat, pid in vocab.producers]
    named += [(pat, pid, True) for pat, pid in vocab.system_producers]
    for pat, pid, dotted in named:
        for m in pat.finditer(clause):
            v = _VERSION.match(clause, m.end())
            if not v or v.end(2) in ends or (dotted and not re.match(r"\d+\.\d", v.group(2))):
                continue
            before = clause[max(0, m.start() - 24) : m.start()]
            opened = bool(open_rx.search(before)) or bool(v.group(1) and not v.group(1).startswith("from"))
            found = [(v.group(2), v.end(2))]
            more = _MORE_VERSIONS.match(clause, v.end(2))
            while more:  # each version of a list or range ("2.10 to 2.15 and beyond") is its own claim
                found.append((more.group(1), more.end(1)))
                more = _MORE_VERSIONS.match(clause, more.end(1))
            for i, (text, end) in enumerate(found):
                ends.add(end)
                after = clause[end : end + 24]
                is_open = bool(open_rx.search(after)) or (opened and i == 0) or text.endswith(("x", "*"))
                out.append(
                    {
                        "producer": pid,
                        "version": text.rstrip(".x*").rstrip("."),
                        "open": is_open,
                        "term": clause[m.start() : end],
                    }
                )
    return out


#: Two negations that cancel before a predicate: "never fails to load", "it is not true that ckptgate
#: cannot load", "there is no ZeRO-1 checkpoint ckptgate cannot load".
_DOUBLE_NEGATION = re.compile(
    r"\b(?:never|not|no longer|n't)\s+(?:\w+\s+)?fail(?:s|ed|ing)?(?:\s+to)?\s*$"
    r"|\bnot\s+(?:true|the case|correct|so)\s+that\b[^,;]*"
    r"\b(?:cannot|can't|can not|not|never|unable to|fails? to|n't)\b"
    r"|\b(?:no|not a single|not one|not any)\s+(?:[\w\0-]+\s+){1,5}?(?:that\s+|which\s+)?"
    r"(?:ckptgate|it|we|the gate|the adapters?|intake)\s+"
    r"(?:cannot|can't|can not|is unable to|fails? to|does not|doesn't)\b",
    re.IGNORECASE,
)


def _negated(vocab: Vocabulary, clause: str, at: int, consumed: list[tuple[int, int]]) -> bool:
    """A negation cue before position ``at`` in the clause (not one consumed as a safety claim)."""
    head = clause[:at]
    head = _mask(head, [(a, min(b, at)) for a, b in consumed if a < at])
    lead = vocab.rx("leading_condition").match(head)
    if lead:  # "If no row is qualified, ckptgate supports ZeRO-1": the "no" is the condition's
        head = " " * lead.end() + head[lead.end() :]
    if _DOUBLE_NEGATION.search(head):
        return False
    head = vocab.rx("not_negation").sub(lambda m: " " * len(m.group()), head)
    if vocab.rx("negation").search(head):
        return True
    w = vocab.rx("without")
    return any(len(head[m.end() :].split()) <= 2 for m in w.finditer(head))


def _agent(vocab: Vocabulary, clause: str, masked: str, at: int, systems: list[dict[str, Any]], passive: bool) -> str:
    if vocab.rx("consumer").search(masked[:at]) and not vocab.rx("project").search(masked[:at]):
        return "consumer"  # "our trainer supports bf16": a consumer's own product, not ckptgate's claim
    if vocab.rx("project").search(clause):
        return "project"
    if vocab.rx("vendor_phrasing").search(clause):
        return "vendor"
    if passive:
        return "implicit"
    subject = [s for s in systems if s["at"] < at]
    if (
        subject
        and vocab.kinds.get(subject[-1]["id"]) in ("tool", "framework")
        and not re.search(
            r"\b(checkpoints?|shards?|files?|state|states|outputs?|layouts?|formats?)\b",
            clause[subject[-1]["at"] : at],
            re.IGNORECASE,
        )
    ):
        return "vendor"
    return "implicit"


def _unknown(vocab: Vocabulary, masked: str, code: list[tuple[int, int]]) -> list[str]:
    return [w for w, _ in _unknown_at(vocab, masked, code)]


def _unknown_at(vocab: Vocabulary, masked: str, code: list[tuple[int, int]]) -> list[tuple[str, int]]:
    """Named things in the clause that the vocabulary does not know: a product, platform, hardware or
    service name (capitalised, all capitals, or a name with digits such as "H100"), with where each
    starts.  Code spans, identifiers (``a_b``, ``A.b``, ``f(``, a name alone in parentheses), agent
    words ("ckptgate"), register ids, versions and a capitalised first word are not names."""
    out = []
    prose = _mask(masked, [*code, *((m.start(), m.end()) for m in _PAREN_NAME.finditer(masked))])
    prose = vocab.rx("project").sub(lambda m: " " * len(m.group()), prose)
    for m in _CAND.finditer(prose):
        word = m.group().strip("-.")
        if not word or "_" in word or word.lower() in vocab.non_systems or word.lower() in vocab.alias_words:
            continue
        if re.fullmatch(r"R\d{2}|v?\d.*|pre-\d.*|[a-z][\w.-]*", word):
            continue
        if re.fullmatch(r"[A-Z][a-z]+", word) and not re.sub(r"[\s\W]", "", prose[: m.start()]):
            continue  # a capitalised first word
        out.append((word, m.start()))
    return out


def _entities(vocab: Vocabulary, masked: str, code: list[tuple[int, int]]) -> list[dict[str, Any]]:
    """What a capability clause is claimed for besides vocabulary systems: unknown names, platforms,
    hardware and infrastructure (``lexicon.platform``), and counts of nodes, ranks or GPUs."""
    prose = _mask(masked, code)
    out: list[dict[str, Any]] = [{"term": w, "kind": "name", "at": at} for w, at in _unknown_at(vocab, masked, code)]
    seen = {e["term"].lower() for e in out}
    for kind in ("platform", "count"):
        for m in vocab.rx(kind).finditer(prose):
            term = m.group().strip()
            if term.lower() not in seen and not any(term.lower() in s or s in term.lower() for s in seen):
                seen.add(term.lower())
                n = re.match(r"\d[\d,]*", term) if kind == "count" else None
                out.append(
                    {
                        "term": term,
                        "kind": kind,
                        "number": int(n.group().replace(",", "")) if n else None,
                        "at": m.start(),
                    }
                )
    return out


#: A predicate inside the condition an "until" states ("is unsupported until a row is qualified",
#: "Until a row is qualified, ZeRO-1 is refused"): the clause's claim is the one it bounds in time.
_UNTIL_CONDITION = re.compile(r"\buntil\s+(?:[^\s,;:]+\s+){0,6}$", re.IGNORECASE)


#: Where the object of a "runs on ..." predicate ends: the noun phrase, up to punctuation.
_OBJECT_END = re.compile(
    r"[,;()\[\]]|\s(?:while|when|whenever|where|because|since|so|and then|before|after|until|that|which|who|whose)\s"
)


def _names_object(
    vocab: Vocabulary,
    masked: str,
    end: int,
    systems: list[dict[str, Any]],
    entities: list[dict[str, Any]],
) -> bool:
    """Whether the object of a locative capability predicate ("runs on X", "deployed in X") names what
    it is claimed for: a system or any other name (known, such as Linux, or not), a platform, a scale
    or a quantifier.  "A program run on the input's terms" or "every rank runs on one kernel" names
    none: unless its subject names a system (:func:`_names_subject`), that describes a mechanism,
    not where something is claimed to work."""
    obj = _object(masked, end)
    last = end + len(obj)
    return (
        any(end <= s["at"] < last for s in systems)
        or any(end <= e["at"] < last for e in entities)
        or bool(_CAND.search(obj))
        or bool(vocab.rx("universal").search(obj))
        or bool(vocab.rx("cross_platform").search(obj))
    )


#: Where the subject of a predicate starts, reading back from it: punctuation, a finite verb or a
#: subordinating word ("is a program run on": the subject of "run" is "a program").
_SUBJECT_START = re.compile(
    r"[,;()\[\]]|\b(?:is|are|was|were|be|been|has|have|had|that|which|who|when|whenever|while|if|once)\b",
    re.IGNORECASE,
)


def _names_subject(masked: str, at: int, systems: list[dict[str, Any]], entities: list[dict[str, Any]]) -> bool:
    """Whether the noun phrase right before a predicate (its subject) names a system or another name:
    "the ZeRO-1 adapter runs in production" claims ZeRO-1 even though its object names no place.  A
    quantifier there is distributive ("every rank runs on one kernel": each process of one job), and
    names in an earlier phrase ("X (DeepSpeed's states) is a program run on ...") are not its subject."""
    starts = [m.end() for m in _SUBJECT_START.finditer(masked, 0, at)]
    first = starts[-1] if starts else 0
    return any(first <= s["at"] < at for s in systems) or any(
        first <= e["at"] < at and e["kind"] == "name" for e in entities
    )


def _object(masked: str, end: int) -> str:
    stop = _OBJECT_END.search(masked, end)
    return masked[end : stop.start() if stop else len(masked)]


def _attributive_subject(vocab: Vocabulary, masked: str, s: dict[str, Any]) -> bool:
    """A safety adjective that opens its clause's subject ("Safe parsing of a header", "A secure
    format") before a negated predicate describes what the clause denies, not a safety conclusion."""
    end = s["at"] + len(s["term"])
    if not re.fullmatch(r"\s*(?:(?:a|an|the|its|this|that)\s+)?", masked[: s["at"]], re.IGNORECASE):
        return False
    tail = masked[end:]
    return bool(re.match(r"\s+[a-z][\w-]*", tail)) and bool(
        vocab.rx("negation").search(vocab.rx("not_negation").sub(" ", tail))
    )


def _nominal_negated(vocab: Vocabulary, masked: str, m: re.Match[str]) -> bool:
    """A capability named as a noun ("support for ZeRO-1", "ZeRO-1 support", "compatibility with X")
    whose own predicate comes after it and denies or defers it: "is not implemented", "is planned",
    "is missing", "is on the roadmap".  A verb ("we support X that is not ...") is not a noun."""
    if not vocab.rx("nominal_capability").fullmatch(m.group()):
        return False
    if vocab.rx("verb_subject").search(masked[: m.start()]):
        return False
    return bool(vocab.rx("nominal_negation").match(masked[m.end() :]))


def _not_enabling(vocab: Vocabulary, masked: str, m: re.Match[str], systems: list[dict[str, Any]]) -> bool:
    """Targeting and enabling phrasing that claims no capability: a part of the documentation as the
    subject of "covers" or "targets" ("this section covers ZeRO-1", "chapter 3 covers Megatron": what
    the text is about), or an audience as the object of "designed for" and its kin ("designed for ML
    platform teams"), unless a system qualifies it ("designed for ZeRO-1 teams")."""
    term = m.group().lower()
    if re.fullmatch(r"(?:targets?|covers?)", term):
        starts = [x.end() for x in _SUBJECT_START.finditer(masked, 0, m.start())]
        return bool(vocab.rx("document_subject").search(masked[starts[-1] if starts else 0 : m.start()]))
    if term.endswith("for"):
        aud = vocab.rx("audience").match(masked, m.end())
        return aud is not None and not any(m.end() <= s["at"] < aud.end() for s in systems)
    return False


def clause_facts(vocab: Vocabulary, clause: str) -> dict[str, Any]:
    code = [(m.start(), m.end()) for m in _CODE.finditer(clause)]
    clause = clause.replace("`", " ")
    systems, masked = _systems(vocab, clause)
    masked = _mask(masked, code)  # a predicate in code (`ckptgate check`) is no claim; systems in it still count
    lex = vocab.lexicon
    safety: list[dict[str, Any]] = []
    consumed: list[tuple[int, int]] = []
    benign = [(m.start(), m.end()) for m in vocab.rx("benign_safety").finditer(masked)]
    for cls in lex.get("safety", {}):
        for m in vocab.rx("safety", cls).finditer(masked):
            if any(a <= m.start() < b for a, b in benign):
                continue
            safety.append({"class": cls, "term": m.group(), "at": m.start()})
            if cls == "harm":
                consumed.append((m.start(), m.end()))
    for imp in impossible_facts(masked):
        if not any(a <= imp["at"] < b for a, b in consumed):
            safety.append(imp)
            consumed.append((imp["at"], imp["at"] + len(imp["term"])))
    for s in safety:
        inside = any(a <= s["at"] < b for a, b in consumed) and s["class"] not in ("harm", "impossible")
        s["negated"] = _negated(vocab, clause, s["at"], consumed) if s["class"] != "impossible" else False
        if s["class"] not in ("harm", "impossible") and vocab.rx("negation").search(s["term"]):
            s["negated"] = True  # the negation is inside the predicate: "is not trusted", "is never considered safe"
        if s["class"] == "inherent" and _attributive_subject(vocab, masked, s):
            s["negated"] = True  # "Safe parsing ... does not establish authenticity": the clause's predicate denies
        s["nested"] = inside
    safety = [s for s in safety if not s.pop("nested")]
    capability: list[dict[str, Any]] = []
    entities = _entities(vocab, masked, code)
    for cls in lex.get("capability", {}):
        for m in vocab.rx("capability", cls).finditer(masked):
            if (
                _LOCATIVE.search(m.group())
                and not _names_object(vocab, masked, m.end(), systems, entities)
                and not _names_subject(masked, m.start(), systems, entities)
            ):
                continue
            if cls == "enable" and _not_enabling(vocab, masked, m, systems):
                continue
            head = masked[: m.start()]
            if _UNTIL_CONDITION.search(head):
                continue  # "refused until a row is qualified": what the refusal waits for, never a claim
            passive = bool(vocab.rx("passive").search(head)) or cls in ("compatible", "out_of_the_box")
            false_after = bool(
                vocab.rx("false_after").match(masked[m.end() :])
                or vocab.rx("object_negation").match(masked[m.end() :])
                or _nominal_negated(vocab, masked, m)
            )
            own = re.sub(r"(?i)\b(?:refus|reject)\w*", " ", m.group())  # a refusal's own word is its predicate
            if _DOUBLE_NEGATION.search(masked[: m.end()]):
                negated = false_after  # "it is not true that ckptgate cannot load X"
            else:  # "cannot load", "is not unsupported": a negation in the predicate counts too
                negated = false_after or _negated(vocab, clause, m.start(), consumed)
                negated = negated or bool(vocab.rx("negation").search(own))
            if cls == "refuse":  # "refuses ZeRO-1" claims nothing; "never refuses ZeRO-1" claims it
                negated = not (negated or bool(vocab.rx("object_negation").match(masked[m.end() :])))
            capability.append(
                {
                    "class": cls,
                    "term": m.group(),
                    "at": m.start(),
                    "hedged": bool(vocab.rx("hedge").search(head) or vocab.rx("hedge").search(m.group())),
                    "passive": passive,
                    "negated": negated,
                    "agent": _agent(vocab, clause, masked, m.start(), systems, passive),
                }
            )
    features = _features(vocab, clause, masked, consumed, systems)
    universal = [m.group() for m in vocab.rx("universal").finditer(masked)]
    for sys in systems:  # a quantifier over a system: "any Megatron-LM checkpoint", "every DeepSpeed release"
        q = re.search(r"\b(?:any|every|all|whatever|arbitrary|each)\s+(?:[\w-]+\s+){0,2}$", clause[: sys["at"]], re.I)
        if q:
            universal.append(q.group().strip() + " " + sys["term"])
    for sys in systems:  # a framework named right after the predicate is its object: "works with PyTorch"
        gap = clause[: sys["at"]]
        sys["object"] = sys["artifact"] or any(
            c["at"] < sys["at"] and len(gap[c["at"] + len(c["term"]) :].split()) <= 2 for c in capability
        )
    topics = sorted(t for t in lex.get("topics", {}) if vocab.rx("topics", t).search(clause))
    # a quantified subject restricted by a version or a lack ("any Linux kernel older than 5.6 lacks
    # openat2", "every kernel since 5.6 has it", "any host without cgroup v2 fails preflight") says
    # what those hosts are: no portability claim.  After a preposition ("works on every kernel since
    # 5.6") it is still where something is claimed to work.
    cues = [
        m
        for m in vocab.rx("cross_platform").finditer(clause)
        if not (
            re.match(r"(?:any|every|all)\b", m.group(), re.IGNORECASE)
            and vocab.rx("quantifier_restriction").match(clause[m.end() :])
            and not re.search(r"\b(?:on|under|across|in|inside|for|with|to|onto)\s+$", clause[: m.start()], re.I)
        )
    ]
    cross = [m.group() for m in cues]
    cross_negated = any(_negated(vocab, clause, m.start(), consumed) for m in cues)
    lead = re.match(
        r"\s*(?:and\s+|,\s*)?(so|therefore|hence|thus|consequently|because|since|which means)\b", clause, re.IGNORECASE
    )
    return {
        "text": clause.strip(),
        "connective": lead.group(1).lower() if lead else "",
        "vendor_phrasing": bool(vocab.rx("vendor_phrasing").search(clause)),
        "negation": bool(vocab.rx("negation").search(vocab.rx("not_negation").sub(" ", clause))),
        "systems": [{"id": s["id"], "term": s["term"], "object": s["object"]} for s in systems],
        "versions": _versions(vocab, clause),
        "capability": [{k: v for k, v in c.items() if k != "at"} for c in capability],
        "safety": [{k: v for k, v in s.items() if k != "at"} for s in safety],
        "topics": topics,
        "universal": universal,
        "scope": [m.group() for m in vocab.rx("scope").finditer(clause)],
        "cross_platform": cross,
        "cross_platform_negated": cross_negated,
        "platform_bounds": [m.group() for m in vocab.rx("platform_bounds").finditer(clause)],
        "hypothetical": _hypothetical(vocab, clause, [*capability, *safety]),
        "unknown": _unknown(vocab, masked, code),
        "entities": [{k: v for k, v in e.items() if k != "at"} for e in entities],
        "features": features,
    }


def _hypothetical(vocab: Vocabulary, clause: str, predicates: list[dict[str, Any]]) -> bool:
    """Whether the clause's claim is conditional or embedded, not asserted: a condition that a row
    is added or qualified, "would need", or "whether" before the predicate ("whether ckptgate reads
    FSDP2 is decided by the matrix").  "Whether or not", "whether A or B, ..." and a "whether" after
    the predicate are concessive ("loads ZeRO-1 whether or not it is signed"), "until" bounds a claim
    in time, and a condition the claim holds against ("anyway", "even if", "regardless") bounds nothing."""
    if vocab.rx("concessive").search(clause):
        return False
    if vocab.rx("hypothetical").search(clause):
        return True
    first = min((p["at"] for p in predicates), default=len(clause))
    return any(
        m.start() < first and not re.match(r"\W*whether\b[^,;]*\bor\b[^,;]*,", clause[m.start() :], re.IGNORECASE)
        for m in re.finditer(r"\bwhether\b", clause, re.IGNORECASE)
    )


def _features(
    vocab: Vocabulary, clause: str, masked: str, consumed: list[tuple[int, int]], systems: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """A clause that says ckptgate checks, verifies, enforces, detects or records something names a
    capability: the predicate, its object (the words after it, to the clause's end) and polarity."""
    out = []
    for m in vocab.rx("feature").finditer(masked):
        head, tail = masked[: m.start()], masked[m.end() :]
        purpose = re.match(r"\s*(?:[\w'-]+\s+){0,4}?for\s+", tail)  # "checked for revocation", "scans X for malware"
        near = " ".join(head.split()[-8:])
        if re.search(r"\b(?:before|after|until|once|unless|whether)\s+(?:[\w-]+\s+){0,3}$", head, re.IGNORECASE):
            continue  # "before anything is verified": a condition, not a feature claim
        if vocab.rx("project").search(near):
            obj_at = purpose.end() if purpose else 0
        elif vocab.rx("passive").search(head) and purpose:
            obj_at = purpose.end()
        else:
            continue
        obj = " ".join(w for w in tail[obj_at:].split()[:12] if w.strip("\0"))
        if not re.search(r"[A-Za-z]{3}", obj):
            continue  # what is checked is code (`--json`), a mention or nothing: no feature named
        out.append(
            {
                "term": m.group(),
                "object": obj,
                "negated": _negated(vocab, clause, m.start(), consumed),
                "agent": _agent(vocab, clause, masked, m.start(), systems, bool(vocab.rx("passive").search(head))),
                "subject": " ".join(head.split()[-6:]),
            }
        )
    return out


def _own_clause(vocab: Vocabulary, text: str) -> bool:
    """A parenthesis with its own predicate, negation or vendor phrasing is a clause of its own."""
    lex = vocab.lexicon
    return bool(
        vocab.rx("vendor_phrasing").search(text)
        or vocab.rx("negation").search(text)
        or any(vocab.rx("capability", c).search(text) for c in lex.get("capability", {}))
        or any(vocab.rx("safety", c).search(text) for c in lex.get("safety", {}))
    )


#: A clause that refers back to another's subject: a pronoun ("but it is unqualified"), a subject left
#: out ("but is unqualified") or a noun for the outcome ("the result is unqualified").
_ANAPHORA = re.compile(
    r"\b(?:it|its|they|them|their|this|these|those|such|either|both)\b"
    r"|^\W*(?:(?:but|and|yet|though|although|while)\s+)?(?:is|are|was|were|has|have|remains?|stays?)\b"
    r"|\bthe (?:result|outcome|load|output)s?\b",
    re.IGNORECASE,
)


def _bounds(vocab: Vocabulary, bound: dict[str, Any], hedged: dict[str, Any]) -> bool:
    """Whether clause ``bound`` bounds the hedge of clause ``hedged`` ("ZeRO-1 may load, but it is
    unqualified"): it says unqualified, unsupported, refused or rowless, about the same systems: it
    names each of them, or it names none and refers back.  A bound on another system ("ZeRO-1 may
    load, and ckptgate refuses FSDP1") or on something else ("; ckptgate refuses pickles") leaves
    the hedged claim standing."""
    if not vocab.rx("hedge_bound").search(bound["text"]):
        return False
    named = {s["id"] for s in bound["systems"]}
    if named:
        return {s["id"] for s in hedged["systems"]} <= named
    return bool(_ANAPHORA.search(bound["text"]))


#: A question's auxiliary before its subject ("Can ckptgate load ...?"), put back in statement order.
_INVERTED = re.compile(
    r"^(\W*)(can|could|will|would|does|do|did|may|might|shall|should|is|are)\s+"
    r"(ckptgate|it|we|they|the gate|the adapters?|intake|this (?:tool|library|project))\s+",
    re.IGNORECASE,
)
_QA_LABEL = re.compile(r"^\W*(?:q|a|question|answer)\s*[:.]\s+", re.IGNORECASE)
#: A question followed by its answer in the same sentence: "?" and then more text.
_ANSWERED = re.compile(r"\?[\"')\]*_]*\s+(?=\S)")


def _split_clauses(vocab: Vocabulary, text: str) -> list[tuple[str, str]]:
    """The clauses of ``text``, a parenthesis with its own predicate blanked (it is a clause of its own)."""
    return _split(_PAREN.sub(lambda m: " " * len(m.group()) if _own_clause(vocab, m.group(1)) else m.group(), text))


def _answer_the_question(vocab: Vocabulary, asked: list[dict[str, Any]], answer: dict[str, Any]) -> None:
    """A question and its answer are one claim: "Does ckptgate support ZeRO-1? Yes." asserts the
    question's predicates, "... ? No." / "Not yet." denies them, and any other answer ("See the
    matrix.", "Only once a row is qualified.") leaves them a question, which asserts nothing."""
    text = answer["text"]
    if answer["negation"] and not _affirmed(vocab, text):
        for c in asked:
            for p in [*c["capability"], *c["safety"]]:
                p["negated"] = True
        return
    yes = bool(vocab.rx("answer_yes").match(text)) or (
        not answer["scope"] and any(not p["negated"] for p in answer["capability"])
    )
    if not yes or answer["hypothetical"]:
        for c in asked:
            c["question"] = True


#: A typographic apostrophe inside a word ("isn\u2019t", "DeepSpeed\u2019s"), not a closing quotation mark.
_APOSTROPHE = re.compile(r"(?<=[A-Za-z])\u2019(?=[A-Za-z])")


def sentence_facts(vocab: Vocabulary, text: str) -> dict[str, Any]:
    """Claim facts for one sentence: its clauses, and sentence-wide cues."""
    text = _APOSTROPHE.sub("'", text)  # "isn\u2019t" reads as "isn't" (one character for one: positions hold)
    quoted = [
        (m.start(), m.end())
        for m in _QUOTED.finditer(text)
        if (m.group(1) is not None and not vocab.is_alias(m.group(1).strip())) or len((m.group(2) or "").split()) >= 3
    ]  # a system's name in quotation marks ("supports “ZeRO-1” checkpoints") is still that system
    body = _mask(text, quoted)
    # the last question that an answer follows: "ZeRO-1? Supported.", "Does ckptgate load X? Yes."
    qa = ([None, *_ANSWERED.finditer(body)])[-1]
    question, answer = (body[: qa.end()], body[qa.end() :]) if qa else ("", body)
    question, answer = _QA_LABEL.sub("", question), _QA_LABEL.sub("", answer)  # "Q: ...? A: Yes."
    asked = _split_clauses(vocab, _INVERTED.sub(r"\1\3 \2 ", question)) if question.strip() else []
    if asked:
        asked[-1] = (asked[-1][0], "?")  # a question that only names a system is labelled by its answer
    split = asked + _split_clauses(vocab, answer)
    split += [c for m in _PAREN.finditer(body) if _own_clause(vocab, m.group(1)) for c in _split(m.group(1))]
    facts = [clause_facts(vocab, c) for c, _ in split]
    _fragments_take_their_predicate(vocab, facts, [d for _, d in split])
    if asked:
        _answer_the_question(vocab, facts[: len(asked)], facts[len(asked)])
    for c in facts:  # "FSDP2 may load, but it is unqualified": a hedge the sentence bounds claims nothing
        if any(d is not c and _bounds(vocab, d, c) for d in facts):
            for p in c["capability"]:
                p["negated"] = p["negated"] or p.pop("hedged")
    for c in facts:
        for p in c["capability"]:
            p.pop("hedged", None)
    return {
        "register_entry": bool(vocab.rx("register_entry").search(text)),
        "clauses": facts,
        "topics": sorted(t for t in vocab.lexicon.get("topics", {}) if vocab.rx("topics", t).search(body)),
        "scope": [m.group() for m in vocab.rx("scope").finditer(body)],
        "vendor_phrasing": bool(vocab.rx("vendor_phrasing").search(body)),
        "interrogative": bool(vocab.rx("interrogative").search(body)),
    }


__all__ = ["Vocabulary", "clause_facts", "clauses", "sentence_facts"]
