"""Sentence and citation extraction for the claims lint."""

from __future__ import annotations

from pathlib import Path

from ckptgate.evidence.claims import citations_in, extract, reference_ids

DOC = """# Title

PyTorch documents DCP [R01]. The second sentence
continues here [R27–R29].

```python
weights_only=True is sufficient  # code is skipped
```

- A list item cites [R11, R12].
<!-- a comment claims ckptgate supports everything -->
| a | table row [R30] |
|---|---|
"""


def test_citation_ranges_and_lists_expand() -> None:
    assert citations_in("x [R27–R29] y [R11, R12] [R31-R33, R35]") == (
        "R11", "R12", "R27", "R28", "R29", "R31", "R32", "R33", "R35")
    assert citations_in("no [citation] here [R1]") == ()


def test_extract_sentences_lines_and_citations() -> None:
    got = [(s.line, s.text, s.citations) for s in extract(DOC, file="d.md")]
    assert got[0] == (1, "Title", ())
    assert got[1] == (3, "PyTorch documents DCP [R01].", ("R01",))
    assert got[2][0] == 3 and got[2][2] == ("R27", "R28", "R29")
    assert "continues here" in got[2][1]
    texts = " ".join(t for _, t, _ in got)
    assert "weights_only" not in texts  # fenced code is skipped
    assert "supports everything" not in texts  # HTML comments are skipped
    assert (10, "A list item cites [R11, R12].", ("R11", "R12")) in got
    assert any(c == ("R30",) and line == 12 for line, _, c in got)


def test_reference_ids_from_table_rows(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "references.md").write_text("| ID | x |\n|---|---|\n| R01 | a |\n| R35 | b |\n")
    assert reference_ids(tmp_path) == ["R01", "R35"]
