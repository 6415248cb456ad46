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


# Probe of held-back-style phrasing (claims-probe): each over-claim below passed before its fix, each
# bounded sentence failed.  Classes: versions written after a system ("DCP 2.9", "Megatron 0.20"),
# version lists and ranges, number lists after a family ("ZeRO-1/2/3", "stages 1-3"), a system in
# quotation marks, a clause that only lists systems (a label, a table cell, "and ZeRO-1 too"), a
# capability named as a noun and then denied ("support for X is not implemented"), a negation inside
# the safety predicate ("is not trusted"), "not tampered with", "no payload can reach the network",
# "any Linux" for OS controls, "device map" spellings, and an interpretation citing a vendor source.
PROBE_OVER = [
    ("ckptgate supports torch DCP 2.9.", ERROR),
    ("ckptgate supports Megatron 0.20 checkpoints.", ERROR),
    ("ckptgate supports Megatron-LM 0.12 checkpoints.", ERROR),
    ("ckptgate supports PyTorch DCP 2.16 checkpoints.", ERROR),
    ("ckptgate supports PyTorch DCP from 2.10 onwards.", ERROR),
    ("ckptgate supports checkpoints from torch 2.10 to 2.15 and beyond.", ERROR),
    ("ckptgate supports DeepSpeed 0.19.8 and 0.20.1.", ERROR),
    ("ckptgate supports torch >= 2.13.", ERROR),
    ("ckptgate supports ZeRO stages 1-3.", ERROR),
    ("ckptgate supports ZeRO stages 1 to 3.", ERROR),
    ("ckptgate supports ZeRO-1/2/3.", ERROR),
    ("ckptgate supports ZeRO 1/2/3 checkpoints.", ERROR),
    ("ckptgate supports FSDP v1/v2.", ERROR),
    ("ckptgate supports \u201cZeRO-1\u201d checkpoints.", ERROR),
    ('ckptgate supports "FSDP2".', ERROR),
    ("ZeRO-1: supported.", ERROR),
    ("ZeRO-1 \u2014 supported.", ERROR),
    ("Supported formats: ZeRO-1, FSDP2, NeMo.", ERROR),
    ("The following are supported: ZeRO-1, FSDP2.", ERROR),
    ("| ZeRO-1 | supported by ckptgate |", ERROR),
    ("ckptgate supports ZeRO-2 \u2013 and also ZeRO-1.", ERROR),
    ("ckptgate reads ZeRO-2 checkpoints, and ZeRO-1 ones too.", ERROR),
    ("ckptgate supports ZeRO-3 checkpoints; ZeRO-1 works too.", ERROR),
    ("A matching SHA-256 proves the checkpoint has not been tampered with.", "claims_surrogate_trust"),
    ("No pickle payload can reach the network from the worker.", "claims_containment_as_proof"),
    ("Containment works on any Linux.", "claims_portable_sandbox"),
    ("The sandbox works on all Linux distributions.", "claims_portable_sandbox"),
    ("The seccomp sandbox works on every Linux kernel.", "claims_portable_sandbox"),
    ("The containment works on any x86_64 Linux host.", "claims_portable_sandbox"),
    ("Accelerate's device-map places shards on each rank.", "claims_unmarked_interpretation"),
    ("A device map splits the checkpoint by rank.", "claims_unmarked_interpretation"),
    ("Safe parsing of a safetensors header establishes authenticity.", "claims_containment_as_proof"),
    # enabling and targeting phrasing, "works on", OS nouns under a quantifier, a version series
    ("ckptgate lets you load FSDP2 checkpoints.", ERROR),
    ("ckptgate enables consolidation of ZeRO-1 checkpoints.", ERROR),
    ("ckptgate is designed for FSDP2 checkpoints.", ERROR),
    ("ckptgate covers ZeRO-1, ZeRO-2 and ZeRO-3.", ERROR),
    ("ckptgate can be used with NeMo checkpoints.", ERROR),
    ("You can use ckptgate with any DeepSpeed version.", ERROR),
    ("ckptgate targets DeepSpeed 0.14 and later.", ERROR),
    ("ckptgate works on any OS.", ERROR),
    ("ckptgate runs on any Linux distribution.", ERROR),
    ("ckptgate supports DeepSpeed 0.19.", ERROR),
    ("ckptgate supports torch 2.", ERROR),
]

PROBE_BOUNDED = [
    "ckptgate supports DCP checkpoints from torch 2.13.0.",
    "ckptgate supports ZeRO stages 2 and 3 at the versions the support matrix records.",
    "ckptgate supports ZeRO-2/3 checkpoints from DeepSpeed 0.19.8.",
    "Support for ZeRO-1 is not implemented.",
    "Support for FSDP2 is planned but not yet qualified.",
    "ZeRO-1 support is not available.",
    "ZeRO-1 support is on the roadmap.",
    "Compatibility with FSDP2 isn't qualified.",
    "Not supported: ZeRO-1, FSDP2, NeMo.",
    "ZeRO-2 and ZeRO-3: supported; ZeRO-1: refused.",
    "ckptgate supports ZeRO-3, but not ZeRO-1.",
    "A recognized filename such as model.safetensors is not trusted.",
    "A file name is never considered trusted.",
    "Safe parsing of a safetensors header does not establish authenticity, path safety or provenance.",
    "In our interpretation, device_map places modules within one process and is not checkpoint-rank topology [R14].",
    "The seccomp profile is Linux-only; other platforms need a reviewed equivalent or must refuse.",
    "If a row is added to the support matrix, ckptgate will support FSDP2.",
    "ZeRO-1 may load, but it is unqualified and the gate refuses it.",
    "ckptgate supports DCP checkpoints from torch 2.13.",
    "The RSS targets are met at 2 GiB.",
    "A bundle made for other files is refused.",
]


def test_probe_over_claims_fail_with_their_rule_and_bounded_sentences_pass() -> None:
    got = _codes([t for t, _ in PROBE_OVER] + PROBE_BOUNDED)
    assert [(t, sorted(c)) for (t, code), c in zip(PROBE_OVER, got, strict=False) if code not in c] == []
    assert {t: c for t, c in zip(PROBE_BOUNDED, got[len(PROBE_OVER):], strict=True) if c} == {}


@pytest.mark.parametrize(("row", "fails"), [
    ("| macOS | yes |", True), ("| Linux | yes |", False), ("| `--json` | yes |", False),
    ("| FSDP2 | yes |", True), ("| ZeRO-1 | \u2705 |", True), ("| ZeRO-1 | no |", False),
    ("| ZeRO-1 | \u274c |", False), ("| ZeRO-3 | yes |", False),
])
def test_a_mark_under_a_capability_column_is_read_with_the_column(tmp_path: Path, row: str, fails: bool) -> None:
    (tmp_path / "README.md").write_text(f"# Formats\n\n| Format | Supported |\n|---|---|\n{row}\n")
    rows = json.loads((DATA / "claims_matrix.json").read_text())["rows"]
    doc = claims_input(tmp_path, rows, vocabulary=local_vocabulary(REPO))
    assert bool([v for v in _violations(doc) if v["code"] == ERROR]) is fails


# Review of the probe heuristics (claims-review): each over-claim below passed after the probe's
# heuristics and each bounded sentence failed, before its fix.  A hedge is bounded only by a clause
# about the same systems (naming them, or naming none and referring back).  A condition is
# hypothetical when it states that a row is added, listed or qualified, not when it only mentions the matrix.
# A part of the docs that "covers" or "targets" a system, and an audience something is "designed for",
# claim no capability.  A quantified subject restricted by a version or a lack ("any Linux kernel older
# than 5.6 lacks openat2") is no portability claim, and "refused" bounds a platform like "refuses".
# A label or list of producer versions or other names takes its neighbour's predicate like systems do.
REVIEW_OVER = [
    ("ZeRO-1 may load; ckptgate refuses FSDP1 checkpoints.", ERROR),
    ("ckptgate may support ZeRO-1, and FSDP1 is not supported.", ERROR),
    ("ckptgate might handle NeMo checkpoints too; Megatron Bridge has no supported row.", ERROR),
    ("ZeRO-1 may load; ckptgate refuses pickled optimizer state.", ERROR),
    ("ZeRO-1 and FSDP2 may load, but ZeRO-1 is unqualified.", ERROR),
    ("When you check the support matrix, you will see that ckptgate supports ZeRO-1.", ERROR),
    ("If you read the matrix, ckptgate supports FSDP2 and ZeRO-1.", ERROR),
    ("When the matrix is updated, ckptgate already supports ZeRO-1.", ERROR),
    ("ckptgate supports ZeRO-1 even when the matrix has no row for it.", ERROR),
    ("ckptgate is designed for ZeRO-1 teams.", ERROR),
    ("The adapter covers FSDP1.", ERROR),
    ("ckptgate covers the NeMo format.", ERROR),
    ("The seccomp sandbox works on every Linux kernel since 5.6.", "claims_portable_sandbox"),
    ("The containment is portable to any Linux host newer than 5.6.", "claims_portable_sandbox"),
    ("DeepSpeed 0.18.0: supported", ERROR),
    ("macOS: supported", ERROR),
    ("Supported platforms: macOS, Windows.", ERROR),
    ("Supported producer versions: DeepSpeed 0.18.0, torch 2.9.0.", ERROR),
]

REVIEW_BOUNDED = [
    "ZeRO-1 may load, but is unqualified.",
    "ZeRO-2 and ZeRO-3 are supported at the versions in the matrix; ZeRO-1 may load, but it has no supported row.",
    "NeMo checkpoints might open, but they are not supported.",
    "Once a ZeRO-1 row is qualified, ckptgate will support ZeRO-1 at that version.",
    "When the matrix lists FSDP2, ckptgate will load it.",
    "ckptgate will support NeMo once it has a qualified row.",
    "Designed for ML platform teams who receive checkpoints from other groups.",
    "Built for ML engineers and MLOps teams.",
    "This section covers ZeRO-1 and why it is refused.",
    "The next section covers FSDP2 sharding.",
    "Chapter 3 covers Megatron.",
    "The threat model covers CVE-2026-24747.",
    "The table below covers DCP, FSDP and ZeRO.",
    "The guide targets DeepSpeed users migrating from ZeRO-1.",
    "any Linux kernel older than 5.6 lacks openat2, so ckptgate refuses to run the worker there.",
    "Every Linux kernel since 5.6 has openat2.",
    "All Linux kernels before 5.6 lack openat2, so the worker is refused on them.",
    "The worker is designed for Linux with seccomp; other platforms are refused.",
    "DeepSpeed 0.19.8: supported",
    "DeepSpeed 0.19.8: qualified",
    "Supported producer versions: DeepSpeed 0.19.8, torch 2.13.0.",
    "Note: supported rows are listed in matrix/SUPPORT.md.",
]


def test_review_over_claims_fail_with_their_rule_and_bounded_sentences_pass() -> None:
    got = _codes([t for t, _ in REVIEW_OVER] + REVIEW_BOUNDED)
    assert [(t, sorted(c)) for (t, code), c in zip(REVIEW_OVER, got, strict=False) if code not in c] == []
    assert {t: c for t, c in zip(REVIEW_BOUNDED, got[len(REVIEW_OVER):], strict=True) if c} == {}


# Probe of question, label, condition and negation phrasing (claims-qa): each over-claim below passed
# before its fix, each bounded sentence must keep passing.  Classes: a question and its answer are
# one claim ("ZeRO-1? Supported.", "Does ckptgate support ZeRO-1? Yes."; "No." denies it, any other
# answer leaves it a question); a label affirmed by yes/true/a check mark ("FSDP2: yes", "FSDP2 = true",
# "ZeRO-1 \u2705"); "until" bounds a claim in time and "whether or not" / "whether A or B," / a "whether"
# after the predicate are concessive, not hypothetical; a negation inside a leading condition ("If no
# row is qualified, ...") is not the main clause's, and a condition the claim holds against ("anyway",
# "even if", "regardless", "by default") bounds nothing; a negated refusal or double negation ("does not
# refuse", "is not unsupported", "never fails to load", "not true that ckptgate cannot load") claims
# the capability; "no less supported than", "FSDP2-ready", "just works", "ships a ZeRO-1 adapter".
QA_OVER = [
    "ZeRO-1? Supported.",
    "Does ckptgate support ZeRO-1? Yes.",
    "ZeRO-1 \u2014 supported? Yes",
    "ZeRO-1? Of course.",
    "Is FSDP2 supported? Absolutely.",
    "Can ckptgate load ZeRO-1 checkpoints? It can.",
    "Which formats does ckptgate support? ZeRO-1 and FSDP2.",
    "Is a pickle safe to load under the worker? Yes.",
    "FSDP2: yes.",
    "FSDP2: true",
    "FSDP2: \u2713",
    "FSDP2 = yes",
    "ZeRO-1 \u2705",
    "NeMo: Yes, fully.",
    "ckptgate supports ZeRO-1 until 2027.",
    "ckptgate supports ZeRO-1 until further notice.",
    "Until a row is qualified, ckptgate supports ZeRO-1 provisionally.",
    "ckptgate loads ZeRO-1 checkpoints whether or not they are signed.",
    "Whether signed or not, ZeRO-1 checkpoints are loaded.",
    "ckptgate supports ZeRO-1 whether the matrix lists it or not.",
    "If no row is qualified, ckptgate supports ZeRO-1 anyway.",
    "Even if no row is qualified, ckptgate supports ZeRO-1.",
    "If the matrix has no FSDP2 row, ckptgate still loads it.",
    "When no row exists, ckptgate supports ZeRO-1 by default.",
    "ckptgate loads FSDP2 even when it is not qualified.",
    "If a row is missing, ckptgate loads FSDP2 anyway.",
    "ZeRO-1 is not unsupported.",
    "ZeRO-1 is not unqualified.",
    "ckptgate does not refuse ZeRO-1 checkpoints.",
    "ckptgate never refuses FSDP2.",
    "ckptgate refuses no FSDP2 checkpoint.",
    "No ZeRO-1 checkpoint is refused.",
    "ckptgate never fails to load ZeRO-1 checkpoints.",
    "It is not true that ckptgate cannot load FSDP2.",
    "There is no ZeRO-1 checkpoint ckptgate cannot load.",
    "FSDP2 is no less supported than ZeRO-3.",
    "ckptgate is FSDP2-ready.",
    "Loading FSDP2 checkpoints just works.",
    "ckptgate ships a ZeRO-1 adapter.",
    "ckptgate includes an FSDP2 reader.",
]

QA_BOUNDED = [
    "Does ckptgate support ZeRO-1? No.",
    "Does ckptgate support ZeRO-1? Not yet: it has no qualified row.",
    "Is FSDP2 supported? See matrix/SUPPORT.md.",
    "Does FSDP2 load? Only once a row is qualified.",
    "Is ZeRO-1 on the roadmap? Maybe.",
    "What does ckptgate load? The formats with a supported row in matrix/SUPPORT.md.",
    "Why is ZeRO-1 refused? It has no qualified row.",
    "ZeRO-1? Refused.",
    "ZeRO-1? Not supported.",
    "ZeRO-3? Supported.",
    "Does ckptgate support ZeRO-3? Yes.",
    "Is a pickle safe to load under the worker? No.",
    "Is a pickle safe to load? Containment is not proof of safety.",
    "FSDP2: no.",
    "FSDP2: false",
    "FSDP2: refused.",
    "ZeRO-3: yes.",
    "ZeRO-3 \u2705",
    "ZeRO-1 \u274c",
    "Signed: yes.",
    "ckptgate does not support ZeRO-1 until a row is qualified.",
    "ckptgate refuses ZeRO-1 until the matrix lists it.",
    "ZeRO-1 checkpoints are refused until a row qualifies them.",
    "A signal inside the rename is held until it ends.",
    "Whether ckptgate supports ZeRO-1 is decided by the matrix.",
    "It is unclear whether FSDP2 checkpoints load.",
    "ckptgate reports whether a checkpoint matches a supported row.",
    "ckptgate supports ZeRO-3 checkpoints whether or not they are sharded.",
    "ckptgate supports ZeRO-1 only if the matrix has a qualified row for it.",
    "If no row is qualified, ckptgate refuses ZeRO-1.",
    "If the matrix has no ZeRO-1 row, ckptgate does not support it.",
    "Once a row is qualified, ckptgate will support FSDP2.",
    "When a row is added to the matrix, ckptgate supports that exact version.",
    "Even if a checkpoint is signed, ckptgate refuses ZeRO-1.",
    "Even when a ZeRO-1 checkpoint is signed, ckptgate does not load it.",
    "When FSDP2 is not in the matrix, ckptgate refuses it.",
    "Without a supported row, ckptgate refuses FSDP2.",
    "ZeRO-1 is unsupported and FSDP2 is refused.",
    "ckptgate refuses ZeRO-1 as well as FSDP2.",
    "Neither ZeRO-1 nor FSDP2 is supported.",
    "ckptgate never loads FSDP2 checkpoints.",
    "ckptgate cannot load FSDP2 checkpoints.",
    "No ZeRO-1 checkpoint is loaded.",
    "ckptgate supports ZeRO-3 as well as ZeRO-2.",
    "ZeRO-1 is not supported, unlike ZeRO-3.",
    "ZeRO-1 support is not available.",
]


def test_questions_labels_conditions_and_double_negations_are_read_as_claims() -> None:
    got = _codes(QA_OVER + QA_BOUNDED)
    assert [t for t, c in zip(QA_OVER, got, strict=False) if not c] == []
    assert {t: c for t, c in zip(QA_BOUNDED, got[len(QA_OVER):], strict=True) if c} == {}


# What users read in Markdown (claims-qa): a question and the sentence after it, even below a FAQ
# heading, are read together; the text around an inline HTML comment is prose; an <img> tag's alt text
# is read and other tags are markup; _underscore_ emphasis is stripped; a check mark under a "Status"
# or "Works" column is read with the column.  Each over-claim passed before its fix.
MD_OVER = [
    "ZeRO-1? Supported.",
    "Does ckptgate support ZeRO-1? Yes.",
    "ZeRO-1 \u2014 supported?\nYes",
    "## Does ckptgate support FSDP2?\n\nYes.",
    "**Q:** Does ckptgate load ZeRO-1 checkpoints?\n**A:** Yes.",
    "ckptgate supports _ZeRO-1_ checkpoints.",
    "ckptgate supports __FSDP2__ checkpoints.",
    "ckptgate supports ZeRO-1. <!-- TODO: qualify -->",
    "<!-- note --> ckptgate supports FSDP2.",
    "Some text <!--\na comment\n--> and ckptgate supports FSDP2.",
    "### ZeRO-1 \u2705",
    '<img src="badge.svg" alt="FSDP2: supported">',
    "<img alt='ckptgate supports ZeRO-1' src='x.png'>",
    "- ZeRO-1: yes\n- FSDP2: yes",
    "| Format | Status |\n|---|---|\n| FSDP2 | \u2705 |",
    "| Format | Works |\n|---|---|\n| FSDP2 | \u2705 |",
]

MD_BOUNDED = [
    "Does ckptgate support ZeRO-1? No.",
    "## Does ckptgate support FSDP2?\n\nNo: it has no qualified row.",
    "## FAQ\n\nIs ZeRO-1 supported? See matrix/SUPPORT.md.",
    "See [ZeRO-1](https://deepspeed.ai) for the format; ckptgate refuses it.",
    '<img src="badge.svg" alt="ZeRO-1: refused">',
    "ckptgate refuses ZeRO-1. <!-- ckptgate supports ZeRO-1 -->",
    "<!--\nckptgate supports FSDP2.\n-->",
    "Write `<!-- ckptgate:generated -->` before a table; ckptgate refuses FSDP2.",
    "| Format | Signed |\n|---|---|\n| FSDP2 | yes |",
    "| Format | Works |\n|---|---|\n| FSDP2 | \u274c |",
    "- ZeRO-3: yes\n- ZeRO-1: no",
    "`__init__` and `weights_only` are names; ckptgate supports **ZeRO-3**.",
]


def test_markdown_questions_comments_tags_and_emphasis_are_read(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    cases = MD_OVER + MD_BOUNDED
    paths = []
    for i, text in enumerate(cases):
        paths.append(tmp_path / "docs" / f"c{i:02d}.md")
        paths[-1].write_text(f"# Case\n\n{text}\n")
    rows = json.loads((DATA / "claims_matrix.json").read_text())["rows"]
    doc = claims_input(tmp_path, rows, vocabulary=local_vocabulary(REPO), docs=paths)
    hit = {v["location"]["file"] for v in _violations(doc) if v["severity"] == "error"}
    flagged = [f"docs/c{i:02d}.md" in hit for i in range(len(cases))]
    assert [t for t, f in zip(MD_OVER, flagged, strict=False) if not f] == []
    assert [t for t, f in zip(MD_BOUNDED, flagged[len(MD_OVER):], strict=True) if f] == []


# A check mark is a check mark in every spelling a keyboard or emoji picker gives: the emoji presentation
# (U+2714 U+FE0F, U+2705 U+FE0F) and the ballot box with check (U+2611, with or without U+FE0F), in prose and
# under a capability column.  Each over-claim passed before its fix.
MARK_OVER = [
    "ZeRO-1 \u2714\ufe0f",
    "ZeRO-1 \u2705\ufe0f",
    "ZeRO-1 \u2611",
    "ZeRO-1: \u2611\ufe0f",
    "| Format | Works |\n|---|---|\n| FSDP2 | \u2611 |",
    "| Format | Status |\n|---|---|\n| FSDP2 | \u2705\ufe0f |",
]

MARK_BOUNDED = [
    "ZeRO-3 \u2714\ufe0f",
    "ZeRO-3 \u2611",
    "| Format | Works |\n|---|---|\n| ZeRO-3 | \u2611\ufe0f |",
    "| Format | Signed |\n|---|---|\n| FSDP2 | \u2611 |",
]


def test_every_spelling_of_a_check_mark_affirms_its_label(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    cases = MARK_OVER + MARK_BOUNDED
    paths = []
    for i, text in enumerate(cases):
        paths.append(tmp_path / "docs" / f"m{i:02d}.md")
        paths[-1].write_text(f"# Case\n\n{text}\n")
    rows = json.loads((DATA / "claims_matrix.json").read_text())["rows"]
    doc = claims_input(tmp_path, rows, vocabulary=local_vocabulary(REPO), docs=paths)
    hit = {v["location"]["file"] for v in _violations(doc) if v["severity"] == "error"}
    flagged = [f"docs/m{i:02d}.md" in hit for i in range(len(cases))]
    assert [t for t, f in zip(MARK_OVER, flagged, strict=False) if not f] == []
    assert [t for t, f in zip(MARK_BOUNDED, flagged[len(MARK_OVER):], strict=True) if f] == []


# The review's probe, then the lead's: contracted double negations (with a typographic apostrophe too),
# a label joined to its value by an arrow or affirmed by a state word, and an "until" whose condition
# (not the clause it bounds) names a qualification.  Each over-claim passed, and each "until" sentence
# below was flagged, before its fix.
LATE_OVER = [
    "ZeRO-1 isn't unsupported.",
    "ZeRO-1 aren\u2019t unsupported.",
    "ZeRO-1 wasn't unqualified.",
    "FSDP2 \u2192 yes",
    "FSDP2 -> yes",
    "FSDP2: enabled",
    "FSDP2: works",
    "FSDP2: available",
    "ckptgate supports ZeRO-1 until 2027.",
    "ZeRO-1 is supported until the next release.",
]
LATE_BOUNDED = [
    "ZeRO-1 is unsupported until a row is qualified.",
    "Until a row is qualified, ZeRO-1 is refused.",
    "FSDP2 stays refused until its row is qualified.",
    "ckptgate will not load FSDP2 until it is qualified.",
    "ZeRO-3: enabled",
    "Signed: available",
    "FSDP2 isn\u2019t supported.",
    "Audit log -> enabled",
    "DeepSpeed\u2019s ZeRO-1 checkpoints are refused.",
]


def test_contractions_arrows_state_words_and_until_conditions() -> None:
    got = _codes(LATE_OVER + LATE_BOUNDED)
    assert [t for t, c in zip(LATE_OVER, got, strict=False) if not c] == []
    assert {t: c for t, c in zip(LATE_BOUNDED, got[len(LATE_OVER):], strict=True) if c} == {}
