"""HTML pages from Jinja2 templates (``evidence/templates/``) with autoescaping: the reviewer report
and the support matrix's ``index.html``.  Every value reaches the page escaped; markup is built only
in the templates and in the cell filters below, through :class:`markupsafe.Markup` formatting,
which escapes its arguments."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from functools import cache
from pathlib import PurePath
from typing import Any

import jinja2
from markupsafe import Markup, escape

#: Where an identifier may wrap: after these characters (``policy.attestation_missing``), never
#: inside a word.
_BREAK_AFTER = re.compile(r"([_./:\-])")


def text(value: Any) -> str:
    """A value as the reviewer reads it: strings as they are, anything else as compact JSON."""
    if isinstance(value, str):
        return value
    if value is None:
        return "-"
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def breakable(value: Any) -> Markup:
    """``value`` escaped, with a line-break opportunity after each separator of an identifier."""
    return Markup("<wbr>").join(escape(part) for part in _BREAK_AFTER.sub(r"\1\0", text(value)).split("\0"))


def mono(value: Any) -> Markup:
    return Markup('<code class="digest">{}</code>').format(text(value))


def word(value: Any) -> Markup:
    return Markup('<code class="word">{}</code>').format(breakable(value))


def code(value: Any) -> Markup:
    return Markup("<code>{}</code>").format(text(value))


def file_row(f: Mapping[str, Any]) -> tuple[Any, ...]:
    return (mono(f.get("path")), word(f.get("kind")), text(f.get("size")), mono(f.get("sha256")), text(f.get("detail")))


def finding_row(f: Mapping[str, Any]) -> tuple[Any, ...]:
    return (word(f.get("severity")), word(f.get("code")), mono(f.get("path")), text(f.get("message")))


def reason_row(r: Mapping[str, Any]) -> tuple[Any, ...]:
    return (word(r.get("severity")), word(r.get("code")), text(r.get("message")))


def signer_row(s: Mapping[str, Any]) -> tuple[Any, ...]:
    if s.get("kind") in ("sigstore", "certificate"):
        how = Markup("identity {}<br>issuer {}").format(mono(s.get("identity")), mono(s.get("issuer")))
        for k, x in sorted((s.get("extensions") or {}).items()):
            how += Markup("<br>{}: {}").format(k, mono(x))
    else:
        how = Markup("algorithm {}<br>key SPKI SHA-256 {}").format(text(s.get("algorithm")), mono(s.get("spki_sha256")))
        if s.get("offered"):
            how += Markup("<br>offered as {}").format(text(s.get("offered")))
    return (text(s.get("signer_id")), word(s.get("kind")), how)


def input_pair(i: Mapping[str, Any]) -> tuple[str, Markup]:
    role = str(i.get("role", "")).replace("_", " ")
    return (
        f"Decided with ({role})",
        Markup("{} ({})<br>{}").format(mono(i.get("path")), text(i.get("origin")), mono(i.get("sha256"))),
    )


def predicate_table(predicate: Any) -> list[tuple[Any, ...]]:
    return [(mono(k), text(x)) for k, x in predicate_rows(predicate)]


def predicate_rows(value: Any, prefix: str = "") -> list[tuple[str, str]]:
    """The predicate flattened to ``(field path, value)`` rows: ``a.b[0].c``; every leaf, in order."""
    if isinstance(value, dict) and value:
        rows: list[tuple[str, str]] = []
        for k in sorted(value, key=str):
            rows += predicate_rows(value[k], f"{prefix}.{k}" if prefix else str(k))
        return rows
    if isinstance(value, list) and value:
        rows = []
        for i, item in enumerate(value):
            rows += predicate_rows(item, f"{prefix}[{i}]")
        return rows
    return [(prefix or "(predicate)", text(value))]


def training_pair(row: tuple[str, str]) -> tuple[str, str]:
    return (f"Training {row[0]}", row[1])


def timing_pair(item: tuple[str, Any]) -> tuple[str, str]:
    return (f"Timing: {item[0]}", text(item[1]))


def basename(value: Any) -> str:
    return PurePath(str(value)).name


def tojson_pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


@cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("ckptgate.evidence", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=False,
        keep_trailing_newline=True,
    )
    env.filters.update(
        text=text,
        breakable=breakable,
        mono=mono,
        word=word,
        code=code,
        file_row=file_row,
        finding_row=finding_row,
        reason_row=reason_row,
        signer_row=signer_row,
        input_pair=input_pair,
        predicate_table=predicate_table,
        basename=basename,
        tojson_pretty=tojson_pretty,
        training_pair=training_pair,
        timing_pair=timing_pair,
    )
    return env


def render(template: str, **context: Any) -> str:
    """``templates/<template>`` rendered with ``context``."""
    return environment().get_template(template).render(**context)


__all__ = ["breakable", "predicate_rows", "render", "text"]
