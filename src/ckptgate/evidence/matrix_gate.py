"""The generated gate (``data.ckptgate.config.qualified``): rendered from a built matrix's
``qualified`` object in a stable order, compared with the committed file, and written whole."""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptgate.errors import UsageError
from ckptgate.evidence.matrix_render import GENERATOR
from ckptgate.userfiles import check_output_file, write_output_file

if TYPE_CHECKING:
    from ckptgate.evidence.matrix import Matrix


def render_gate(m: Matrix) -> bytes:
    """The generated gate file (``data.ckptgate.config.qualified``): every adapter's qualified rows,
    in a stable order.  It names nothing that moves with the code (no candidate commit, no policy
    revision), so it changes only when the retained qualifications do."""
    adapters: dict[str, Any] = {}
    for name, entry in sorted((m.qualified.get("adapters") or {}).items()):
        rows = sorted(
            entry.get("rows") or [],
            key=lambda r: (
                str(r.get("format")),
                _version_key(r.get("producer_version")),
                json.dumps(r.get("topology"), sort_keys=True),
                str(r.get("fixture_digest")),
                str(r.get("attestation")),
            ),
        )
        versions = {fmt: sorted(vs, key=_version_key) for fmt, vs in sorted((entry.get("versions") or {}).items())}
        adapters[name] = {"producer": entry.get("producer"), "versions": versions, "rows": rows}
    hf_rows = sorted(
        (m.qualified.get("hf_mapping") or {}).get("qualified") or [],
        key=lambda r: (
            str(r.get("family")),
            _version_key(r.get("release")),
            [r.get(a) for a in ("tp", "pp", "ep")],
            str(r.get("fixture_digest")),
            str(r.get("attestation")),
        ),
    )
    doc = {
        "generated": {
            "by": GENERATOR,
            "note": "generated from passing qualification attestations with retained evidence; do not edit by hand",
        },
        "adapters": adapters,
        "hf_mapping": {"qualified": hf_rows},
    }
    return (json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def _version_key(v: Any) -> tuple[tuple[int, ...], str]:
    text = str(v)
    nums = []
    for part in text.split("+", 1)[0].split("-", 1)[0].split("."):
        if not part.isdigit():
            break
        nums.append(int(part))
    return tuple(nums), text


def gate_diff(m: Matrix, gate_file: Path) -> str | None:
    """A unified diff between the regenerated gate and ``gate_file`` (``None`` when equal)."""
    new = render_gate(m).decode()
    try:
        old = gate_file.read_text(encoding="utf-8")
    except OSError:
        old = ""
    if old == new:
        return None
    return drift(old, new, gate_file.name, context=2)


def drift(old: str, new: str, name: str, *, context: int) -> str:
    """The unified diff from the committed ``old`` to the regenerated ``new`` text of ``name``
    (a line naming the file when they differ in nothing a line diff shows)."""
    lines = difflib.unified_diff(
        old.splitlines(keepends=True),
        new.splitlines(keepends=True),
        fromfile=f"committed/{name}",
        tofile=f"regenerated/{name}",
        n=context,
    )
    return "".join(lines) or f"{name} differs\n"


def write_gate(m: Matrix, gate_file: Path) -> bool:
    """Write the generated gate into ``gate_file`` whole; True when its bytes changed."""
    data = render_gate(m)
    try:
        if gate_file.read_bytes() == data:
            return False
    except OSError:
        pass
    try:
        gate_file.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(
            "usage.output_parent",
            f"cannot create {gate_file.parent}: {e.strerror}",
            advice=f"Make {gate_file.parent} creatable by this user (`ls -ld {gate_file.parent.parent}`), then run "
            "again.",
        ) from None
    check_output_file(gate_file, what="the generated gate")
    write_output_file(gate_file, data, what="the generated gate")
    return True
