"""Regression tests of the closed-world claim model (#35) on the sentences that ckptgate's own docs
showed it misread, written as classes: a locative predicate claims what its object names, a
hyphenated count describes one thing, a restriction to rows bounds the scope, and identifiers the
source uses are not product names.  Over-claims of each class stay errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_claims_model import DATA, REPO, _judge, _violations

from ckptgate.evidence.claims import claims_input, local_vocabulary

ERROR = "claims_support_not_in_matrix"


def _codes(texts: list[str]) -> list[set[str]]:
    rows = json.loads((DATA / "claims_matrix.json").read_text())["rows"]
    got = _judge(texts, rows)
    return [got.get(i + 1, set()) for i in range(len(texts))]


BOUNDED = [
    # a mechanism, not where something is claimed to work: the object of "run on" names nothing
    "Every rank runs on one kernel, and every rank opened the same inodes.",
    "When every rank runs on one kernel, a rank copies under its own read leases.",
    "A framework deserializer (DeepSpeed's optimizer states, Megatron's args) is a program run on the input's terms.",
    "The checks run in the digest's read on the rank that streams each file.",
    # the machine a measurement ran on: one machine, with N cores
    "The benchmark was run on 2026-12-01 at 23:50 UTC on the project's 2-core machine.",
    "Timings were taken on a 16-core machine with 64 GiB of memory.",
    # scope restricted to rows
    "Only the Megatron rows in docs/consolidation.md are qualified.",
    "Policy data allows only the Megatron rows that are qualified.",
    # a scale a supported row records
    "ckptgate runs on 2 ranks.",
]

OVER = [
    "ckptgate runs on macOS.",
    "ZeRO-1 checkpoints run on Linux.",  # the subject's system still counts when the object names a place
    "The ZeRO-1 adapter runs in production.",  # and when it names none
    "Every Megatron-LM checkpoint runs in production.",
    "The Frobnicator backend runs in production.",
    "Every rank runs on macOS.",
    "The DeepSpeed adapter runs in Kubernetes pods.",
    "The gate runs on a 64-node cluster.",
    "Intake has been tested on 8-GPU nodes.",
    "ckptgate runs on 512 ranks.",
    "ckptgate runs on every platform.",
    "Megatron checkpoints are qualified.",
    "Megatron checkpoints at any topology are qualified.",
]


def test_bounded_descriptions_are_clean_and_over_claims_of_the_same_shape_are_errors() -> None:
    got = _codes(BOUNDED + OVER)
    assert {t: c for t, c in zip(BOUNDED, got, strict=False) if c} == {}
    assert [t for t, c in zip(OVER, got[len(BOUNDED):], strict=True) if ERROR not in c] == []


@pytest.mark.parametrize("constant", ["signal.SIGINT", "SIGINT = 2"])
def test_a_constant_the_source_uses_is_an_identifier_not_a_product(tmp_path: Path, constant: str) -> None:
    (tmp_path / "README.md").write_text("# Tool\n\nSIGINT is handled at launch.\n")
    doc = claims_input(tmp_path, [], vocabulary=local_vocabulary(REPO))
    assert {v["code"] for v in _violations(doc)} == {ERROR}  # an unknown name in a capability claim
    (tmp_path / "src" / "tool").mkdir(parents=True)
    (tmp_path / "src" / "tool" / "sig.py").write_text(f"import signal\n\n{constant}\n")
    doc = claims_input(tmp_path, [], vocabulary=local_vocabulary(REPO))
    assert _violations(doc) == []
