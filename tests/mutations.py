"""Seeded mutations of real inputs, for the tests that feed every stage hostile variants of what
the producers wrote.  Each mutation is one small, deterministic change chosen by ``rng``, so a
failing case is named by its fixture and seed and can be replayed."""

from __future__ import annotations

import io
import json
import random
import struct
import zipfile
from pathlib import Path
from collections.abc import Iterator
from typing import Any

#: Values a hostile writer puts where a field was: wrong types, bounds, empties, look-alikes.
ODD: tuple[Any, ...] = (None, -1, 0, 1, 2**31, 2**63, 2**64 + 7, -2**63, 1.5, 1e308, "", "x", "F32", "BF16",
                        "passed", "failed", "0" * 40, "sha256:" + "0" * 64, [], [0], [-1, 5], {}, {"a": 1}, True)

#: Pickle opcodes, for substitutions that keep a pickle looking like one.
_OPCODES = b"()*.0123456789:=BCDEFGHIJKLMNPQRSTUVXabcdehijklmopqrstu}\x80\x81\x82\x83\x84\x85\x86\x87\x88\x89" \
           b"\x8a\x8b\x8c\x8d\x8e\x8f\x90\x91\x92\x93\x94\x95\x96"


def _paths(doc: Any) -> list[list[Any]]:
    """Every node's path in ``doc`` (the first 50 keys and 20 items of each container)."""
    out: list[list[Any]] = []

    def walk(node: Any, path: list[Any]) -> None:
        out.append(path)
        if isinstance(node, dict):
            for k in list(node)[:50]:
                walk(node[k], [*path, k])
        elif isinstance(node, list):
            for i in range(min(len(node), 20)):
                walk(node[i], [*path, i])

    walk(doc, [])
    return out


def single_changes(doc: Any) -> Iterator[tuple[Any, str]]:
    """Every one-field change of ``doc``: each node below the root set to each of :data:`ODD`, and
    each key deleted; a fresh copy each time."""
    for path in _paths(doc)[1:]:
        for value in (*ODD, _DELETE):
            changed = json.loads(json.dumps(doc))
            parent = changed
            for p in path[:-1]:
                parent = parent[p]
            if value is _DELETE:
                if not isinstance(parent, dict):
                    continue
                del parent[path[-1]]
                yield changed, f"del {path}"
            else:
                parent[path[-1]] = value
                yield changed, f"set {path}={value!r}"


_DELETE = object()


def mutate_json(doc: Any, rng: random.Random) -> tuple[Any, str]:
    """One change to a JSON document: a value replaced, a key deleted or added, an item duplicated.
    Returns the document (changed in place where it could be) and what was done."""
    path = rng.choice(_paths(doc))
    if not path:
        value = rng.choice(ODD)
        return value, f"root={value!r}"
    parent = doc
    for p in path[:-1]:
        parent = parent[p]
    op, key = rng.random(), path[-1]
    if op < 0.15 and isinstance(parent, dict):
        del parent[key]
        return doc, f"del {path}"
    if op < 0.25 and isinstance(parent, dict):
        parent[f"extra{rng.randrange(2)}"] = rng.choice(ODD)
        return doc, f"add beside {path}"
    if op < 0.35 and isinstance(parent, list):
        parent.append(json.loads(json.dumps(parent[key])))
        return doc, f"dup {path}"
    current = parent[key]
    if isinstance(current, int) and not isinstance(current, bool) and op < 0.6:
        parent[key] = current + rng.choice([-1, 1, 8, -8, 4096, current, -current])
    else:
        parent[key] = rng.choice(ODD)
    return doc, f"set {path}={parent[key]!r}"


def mutate_bytes(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """One byte-level change: bits flipped, an opcode or edge value written, a cut, a repeat, a gap,
    or a little-endian int overwritten."""
    b = bytearray(data)
    if not b:
        return rng.randbytes(rng.randrange(1, 16)), "filled"
    i, op = rng.randrange(len(b)), rng.randrange(7)
    if op == 0:
        for _ in range(rng.randrange(1, 5)):
            j = rng.randrange(len(b))
            b[j] ^= 1 << rng.randrange(8)
    elif op == 1:
        b[i] = rng.choice(_OPCODES)
    elif op == 2:
        b[i] = rng.choice([0, 0xFF, 0x7F, 0x80, 0x01])
    elif op == 3:
        del b[i:]
    elif op == 4:
        k = rng.randrange(len(b))
        b[k:k] = b[i:i + rng.randrange(1, 64)]
    elif op == 5:
        del b[i:i + rng.randrange(1, 16)]
    else:
        b[i:i + 4] = struct.pack("<i", rng.choice([-1, 0, 1, 2**31 - 1, -2**31, rng.randrange(-100, 100000)]))
    return bytes(b), f"bytes op {op} at {i}"


#: Same-width values for the fixed-width arguments pickles carry their numbers in.
_INT_ARGS = {"BININT": ("<i", (-1, 0, 1, 2, 7, 2**31 - 1, -2**31)), "BININT1": ("<B", (0, 1, 2, 255)),
             "BININT2": ("<H", (0, 1, 2, 65535)), "BINFLOAT": (">d", (float("nan"), float("inf"), -1.0, 0.0, 1e308))}
_TEXT_ARGS = {"SHORT_BINUNICODE", "BINUNICODE", "SHORT_BINBYTES", "BINBYTES", "SHORT_BINSTRING", "BINSTRING"}


def mutate_pickle_values(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """One value inside a well-formed pickle changed in place, at the same width, so the result is
    still a well-formed pickle that says something else: an int, a float, or a string (another
    string of the same length from the same pickle, or its own characters shuffled).  The opcodes
    are listed with :func:`pickletools.genops`, which reads and never executes."""
    import pickletools
    import warnings

    try:
        with warnings.catch_warnings():  # genops decodes protocol-0 strings with a deprecated escape
            warnings.simplefilter("ignore", DeprecationWarning)
            ops = [(op.name, arg, pos) for op, arg, pos in pickletools.genops(data)]
    except (ValueError, EOFError):
        return mutate_bytes(data, rng)
    numbers = [(n, pos) for n, _, pos in ops if n in _INT_ARGS]
    texts = [(n, arg, pos) for n, arg, pos in ops if n in _TEXT_ARGS and isinstance(arg, (str, bytes)) and arg]
    b = bytearray(data)
    if numbers and (not texts or rng.random() < 0.6):
        name, pos = rng.choice(numbers)
        fmt, values = _INT_ARGS[name]
        value = rng.choice(values)
        b[pos + 1:pos + 1 + struct.calcsize(fmt)] = struct.pack(fmt, value)
        return bytes(b), f"pickle {name} at {pos} = {value!r}"
    if not texts:
        return mutate_bytes(data, rng)
    name, arg, pos = rng.choice(texts)
    raw = arg.encode("utf-8", "surrogatepass") if isinstance(arg, str) else arg
    same = [a for _, a, _ in texts if len(a.encode("utf-8", "surrogatepass") if isinstance(a, str) else a) == len(raw)
            and a != arg]
    if same and rng.random() < 0.5:
        other = rng.choice(same)
        new = other.encode("utf-8", "surrogatepass") if isinstance(other, str) else other
    else:
        new = bytes(rng.sample(list(raw), len(raw)))
    width = {"SHORT_BINUNICODE": 1, "SHORT_BINBYTES": 1, "SHORT_BINSTRING": 1}.get(name, 4)
    start = pos + 1 + width
    b[start:start + len(raw)] = new
    return bytes(b), f"pickle {name} at {pos}: {arg!r} -> {new!r}"


def mutate_file(path: Path, rng: random.Random) -> tuple[bytes, str]:
    """New contents for ``path``, one change deep where the format allows it.

    * A torch zip (``.pt``) is rebuilt around one changed member, most often its pickle, so the
      CRCs and the directory still agree and the change reaches the pickle reader.
    * A safetensors header is changed as JSON and padded back to its length where it fits, so the
      offsets other files record stay true.
    * Other JSON is changed as JSON; anything else byte by byte.
    """
    data = path.read_bytes()
    if path.suffix == ".pt" and rng.random() < 0.8:
        try:
            with zipfile.ZipFile(path) as z:
                infos = z.infolist()
                members = {i.filename: z.read(i) for i in infos}
        except Exception:  # noqa: BLE001 - an earlier mutation may have left a zip zipfile cannot read
            members = {}
        if members:
            pickles = [n for n in members if n.endswith(".pkl")]
            name = rng.choice(pickles) if pickles and rng.random() < 0.85 else rng.choice(sorted(members))
            change = mutate_pickle_values if name.endswith(".pkl") and rng.random() < 0.5 else mutate_bytes
            members[name], how = change(members[name], rng)
            out = io.BytesIO()
            with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
                for info in infos:
                    z.writestr(info.filename, members[info.filename])
            return out.getvalue(), f"zip member {name}: {how}"
    if len(data) >= 9 and data[8:9] == b"{" and rng.random() < 0.85:
        n = struct.unpack("<Q", data[:8])[0]
        try:
            header = json.loads(data[8:8 + n]) if n <= len(data) - 8 else None
        except ValueError:
            header = None
        if isinstance(header, dict):
            header, how = mutate_json(header, rng)
            raw = json.dumps(header).encode()
            raw += b" " * (max(n, len(raw)) - len(raw))
            raw += b" " * (-len(raw) % 8)
            return struct.pack("<Q", len(raw)) + raw + data[8 + n:], f"safetensors header: {how}"
    try:
        doc = json.loads(data)
    except ValueError:
        doc = None
    if doc is not None and rng.random() < 0.8:
        doc, how = mutate_json(doc, rng)
        return json.dumps(doc).encode(), f"json: {how}"
    if data[:1] == b"\x80" and rng.random() < 0.5:  # a bare pickle, such as DCP's .metadata
        return mutate_pickle_values(data, rng)
    return mutate_bytes(data, rng)


def zip_members(data: bytes) -> list[tuple[str, bytes]]:
    """A zip's members in record order (duplicates kept), read with :mod:`zipfile`."""
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        return [(i.filename, z.read(i)) for i in z.infolist()]


def build_zip(members: list[tuple[str, bytes]]) -> bytes:
    """A stored zip holding ``members`` in that order, duplicates and odd names as given."""
    import warnings

    out = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns on a duplicate name, and writes it
        with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
            for name, data in members:
                z.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), data)
    return out.getvalue()


#: Other spellings of ``prefix/rel`` that some reader takes for the same file.
_SPELLINGS: tuple[tuple[str, Any], ...] = (
    ("ascii-upper", lambda p, r: f"{p}/{r.upper()}"),
    ("ascii-title", lambda p, r: f"{p}/{r[:1].upper()}{r[1:]}"),
    ("nfkc-fullwidth", lambda p, r: p + "/" + "".join(chr(ord(c) + 0xFEE0) if "a" <= c <= "z" else c for c in r)),
    ("nfkc-fullwidth-solidus", lambda p, r: f"{p}\uff0f{r}"),
    # KELVIN SIGN, or LATIN SMALL LETTER LONG S: both fold (and NFKC-normalise) to ASCII
    ("unicode-casefold", lambda p, r: p + "/" + r.replace("k", "\u212a", 1) if "k" in r
     else p + "/" + r.replace("s", "\u017f", 1) if "s" in r else None),
    ("dot-segment", lambda p, r: f"{p}/./{r}"),
    ("double-slash", lambda p, r: f"{p}//{r}"),
    ("trailing-slash", lambda p, r: f"{p}/{r}/"),
    ("backslash", lambda p, r: f"{p}\\{r}"),
    ("leading-slash", lambda p, r: f"/{p}/{r}"),
    ("dot-dot", lambda p, r: f"{p}/x/../{r}"),
)


def zip_name_mutations(data: bytes, rng: random.Random) -> Iterator[tuple[bytes, str, bool]]:
    """Deliberate name mutations of a torch zip: ``(zip bytes, what was done, must the static reader
    refuse it)``.  Collisions put a second entry beside a record torch reads (``data.pkl``, a
    storage, ``version``...) whose name is the same under case folding, NFC/NFKC or path
    normalisation, before or after it, holding other bytes (the original pickle, when ``data.pkl``
    itself is swapped for a pickle of ``None``: the issue #16 recipe); exact duplicates; a record
    renamed to another case; inconsistent prefixes.  Harmless rewrites (record order shuffled, a
    new prefix) must stay readable."""
    members = zip_members(data)
    prefix = members[0][0].split("/", 1)[0]
    rels = [n[len(prefix) + 1:] for n, _ in members]
    none_pickle = b"\x80\x02N."
    targets = sorted({r for r in rels if r == "data.pkl" or r.startswith("data/") or r in ("version", "byteorder")})
    for rel in targets:
        i = rels.index(rel)
        orig = members[i][1]
        for kind, spell in _SPELLINGS:
            other = spell(prefix, rel)
            if other is None:
                continue
            for before in (False, True):
                changed = list(members)
                if rel == "data.pkl":
                    changed[i] = (members[i][0], none_pickle)
                    twin = (other, orig)
                else:
                    twin = (other, bytes(rng.randrange(256) for _ in range(len(orig))) if orig else b"x")
                changed.insert(i if before else i + 1, twin)
                yield build_zip(changed), f"{kind} twin of {rel} {'before' if before else 'after'} it", True
        changed = list(members)
        changed.insert(i + 1, members[i])
        yield build_zip(changed), f"exact duplicate of {rel}", True
        changed = list(members)
        changed[i] = (f"{prefix}/{rel.upper()}", orig)
        yield build_zip(changed), f"{rel} renamed to {rel.upper()}", True
    composed = [(n, d) for n, d in members] + [(f"{prefix}/caf\u00e9", b"a"), (f"{prefix}/cafe\u0301", b"b")]
    yield build_zip(composed), "NFC-equal names beside the records", True
    yield build_zip([(f"{prefix.upper()}/{n.split('/', 1)[1]}" if k == 1 else n, d)
                     for k, (n, d) in enumerate(members)]), "second entry under another-case prefix", True
    yield build_zip([(f"other/{n.split('/', 1)[1]}" if k == len(members) - 1 else n, d)
                     for k, (n, d) in enumerate(members)]), "last entry under another prefix", True
    yield build_zip([(n.split("/", 1)[1], d) if k == 0 else (n, d) for k, (n, d) in enumerate(members)]), \
        "first entry without a prefix", True
    shuffled = list(members)
    rng.shuffle(shuffled)
    yield build_zip(shuffled), "records shuffled", False
    yield build_zip([(f"renamed/{n.split('/', 1)[1]}", d) for n, d in members]), "new prefix", False
