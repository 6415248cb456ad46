"""The claim model against a labelled corpus, and the lint over everything users read.

``data/claims_corpus.jsonl`` holds over-claims of every claim rule in varied contributor phrasing
(``expect``: the violation code) and bounded sentences that must pass (``expect``: null). The
corpus is judged against a fixed snapshot of matrix rows (``data/claims_matrix.json``), so the
measured precision and recall do not move when the committed matrix is regenerated.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from ckptgate.evidence.check import find_tool
from ckptgate.evidence.claims import (Sentence, api_docstrings, citations_in, claims_input, cli_help, committed_rows,
                                      extract, generated_rows, local_vocabulary, reference_ids, with_facts)

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"
ENTRY = "data.ckptgate.claims.violations"


def _violations(doc: dict[str, Any]) -> list[dict[str, Any]]:
    opa = find_tool("opa", REPO)
    assert opa, "opa is needed (scripts/bootstrap.py setup)"
    proc = subprocess.run([opa, "eval", "-d", str(REPO / "policies"), "-I", "-f", "json", ENTRY],
                          input=json.dumps(doc), capture_output=True, text=True, check=True, timeout=300)
    return json.loads(proc.stdout)["result"][0]["expressions"][0]["value"]


def _corpus() -> list[dict[str, Any]]:
    return [json.loads(line) for line in (DATA / "claims_corpus.jsonl").read_text().splitlines() if line.strip()]


def _judge(texts: list[str], rows: list[dict[str, Any]]) -> dict[int, set[str]]:
    vocab = local_vocabulary(REPO)
    items = [Sentence(file="corpus", line=i + 1, text=t, citations=citations_in(t)) for i, t in enumerate(texts)]
    doc = {"sentences": with_facts(items, vocab), "references": reference_ids(REPO), "matrix": rows, "generated": []}
    got: dict[int, set[str]] = {}
    for v in _violations(doc):
        if v["severity"] == "error":
            got.setdefault(v["location"]["line"], set()).add(v["code"])
    return got


def test_corpus_precision_and_recall() -> None:
    corpus = _corpus()
    over = [c for c in corpus if c["expect"]]
    assert len(corpus) >= 200 and len(over) >= 100
    assert {c["expect"] for c in over} >= {
        "claims_vendor_phrasing", "claims_vendor_as_support", "claims_unmarked_interpretation",
        "claims_support_not_in_matrix", "claims_archived_not_historical", "claims_containment_as_proof",
        "claims_surrogate_trust", "claims_portable_sandbox"}
    rows = json.loads((DATA / "claims_matrix.json").read_text())["rows"]
    got = _judge([c["text"] for c in corpus], rows)
    tp = sum(1 for i, c in enumerate(corpus) if c["expect"] and got.get(i + 1))
    fp = [c["text"] for i, c in enumerate(corpus) if not c["expect"] and got.get(i + 1)]
    fn = [c["text"] for i, c in enumerate(corpus) if c["expect"] and not got.get(i + 1)]
    wrong_rule = [(c["text"], sorted(got[i + 1])) for i, c in enumerate(corpus)
                  if c["expect"] and got.get(i + 1) and c["expect"] not in got[i + 1]]
    precision = tp / (tp + len(fp)) if tp + len(fp) else 1.0
    recall = tp / len(over)
    report = (f"claims corpus: {len(corpus)} sentences, {len(over)} over-claims; "
              f"precision {precision:.3f}, recall {recall:.3f}; rule codes right on "
              f"{tp - len(wrong_rule)}/{tp}")
    print(report)
    assert precision == 1.0, f"{report}; false positives: {fp}"
    assert recall >= 0.95, f"{report}; missed: {fn}"


def test_repository_text_has_no_violations_and_is_all_read() -> None:
    doc = claims_input(REPO, committed_rows(REPO), vocabulary=local_vocabulary(REPO))
    origins = {s["origin"] for s in doc["sentences"]}
    assert origins == {"doc", "generated-notes", "cli", "docstring"}
    files = {s["file"] for s in doc["sentences"]}
    assert {"README.md", "docs/threat-model.md", "matrix/SUPPORT.md", "src/ckptgate/_cli/check_cmd.py",
            "src/ckptgate/enforce/containment.py"} <= files
    assert doc["generated"] and all(g["file"] == "matrix/SUPPORT.md" for g in doc["generated"])
    errors = [v for v in _violations(doc) if v["severity"] == "error"]
    assert errors == []


def test_cli_help_and_public_docstrings_are_collected(tmp_path: Path) -> None:
    cli = tmp_path / "src" / "ckptgate" / "_cli"
    cli.mkdir(parents=True)
    (tmp_path / "src" / "ckptgate" / "__init__.py").write_text(
        '"""Pkg.\n\n* :mod:`ckptgate.enforce` runs loaders.\n"""\n')
    (cli / "x_cmd.py").write_text(
        "import click\n\n@click.command()\n@click.option('--x', help='ckptgate handles ZeRO-1 checkpoints.')\n"
        "def x():\n    \"\"\"The worker makes untrusted pickles harmless.\n\n    Example::\n\n"
        "        this is safe code\n    \"\"\"\n")
    enforce = tmp_path / "src" / "ckptgate" / "enforce"
    enforce.mkdir()
    (enforce / "__init__.py").write_text(
        '"""Loads under seccomp, which works the same on macOS."""\n\n__all__ = ["f"]\n\n'
        'def f():\n    """A checksum proves the file is authentic."""\n\ndef g():\n    """Private: safe."""\n')
    help_ = {(s.line, s.text) for s in cli_help(tmp_path)}
    assert (4, "ckptgate handles ZeRO-1 checkpoints.") in help_
    assert any(t.startswith("The worker makes") for _, t in help_)
    assert not any("safe code" in t for _, t in help_)  # literal blocks are not prose
    docs = {(s.file, s.text) for s in api_docstrings(tmp_path)}
    assert ("src/ckptgate/enforce/__init__.py", "A checksum proves the file is authentic.") in docs
    assert not any("Private" in t for _, t in docs)  # not exported
    doc = claims_input(tmp_path, [], vocabulary=local_vocabulary(REPO))
    codes = {(v["location"]["file"], v["code"]) for v in _violations(doc)}
    assert {("src/ckptgate/_cli/x_cmd.py", "claims_support_not_in_matrix"),
            ("src/ckptgate/_cli/x_cmd.py", "claims_containment_as_proof"),
            ("src/ckptgate/enforce/__init__.py", "claims_portable_sandbox"),
            ("src/ckptgate/enforce/__init__.py", "claims_surrogate_trust")} <= codes


GENERATED = """# Page

<!-- ckptgate:generated support table -->
| status | format | adapter | fixture |
|---|---|---|---|
| supported | fsdp-full | fsdp-full 0.1.0 | sha256:4057d89ae0c0… |
| supported | fsdp-local | fsdp-full 0.1.0 | fsdp_full (sha256:4057d89ae0c0…) |
<!-- /ckptgate:generated -->

ckptgate reads FSDP2 checkpoints.
"""


def test_generated_blocks_are_checked_against_data_not_as_prose(tmp_path: Path) -> None:
    prose = [s.text for s in extract(GENERATED, file="d.md")]
    assert "ckptgate reads FSDP2 checkpoints." in prose
    assert not any("fsdp-local" in t for t in prose)
    gen = generated_rows(GENERATED, file="d.md")
    assert [g.line for g in gen] == [6, 7]
    assert gen[0].row == {"status": "supported", "adapter": "fsdp-full", "adapter_version": "0.1.0",
                          "format": ["fsdp-full"], "fixture": "sha256:4057d89ae0c0"}
    assert gen[1].row["fixture"] == "sha256:4057d89ae0c0"  # the name beside the digest, as SUPPORT.md shows it
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "d.md").write_text(GENERATED)
    rows = json.loads((DATA / "claims_matrix.json").read_text())["rows"]
    doc = claims_input(tmp_path, rows, vocabulary=local_vocabulary(REPO))
    got = {(v["location"]["line"], v["code"]) for v in _violations(doc)}
    assert got == {(7, "claims_generated_mismatch"), (10, "claims_support_not_in_matrix")}


@pytest.mark.parametrize("text", [
    "The contained worker is a universal sandbox.",
    "ckptgate handles ZeRO-1 checkpoints out of the box.",
    "weights_only=True makes a load harmless.",
])
def test_consumer_repository_uses_its_own_matrix(tmp_path: Path, text: str) -> None:
    (tmp_path / "README.md").write_text(f"# Consumer\n\n{text}\n")
    doc = claims_input(tmp_path, None, vocabulary=local_vocabulary(REPO))
    assert doc["matrix"] == [] and doc["sentences"][-1]["origin"] == "doc"
    assert [v for v in _violations(doc) if v["severity"] == "error"]
