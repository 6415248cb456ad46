"""Every real fixture, changed by seeded hostile mutations (``tests/mutations.py``), through
inspect, digest, plan and write: each case ends in findings or in a typed error with a stable
code, and never in any other exception (which the CLI would show as a traceback); and what is
written, the ``safetensors`` library reads as the plan says.

A failure names the fixture, the seed and the mutation, so it can be replayed with
``_mutated(name, seed, tmp_path)``.  ``CKPTGATE_MUTATION_SEEDS`` sets the seeds per fixture (24 by
default; 2,000 per fixture ran clean on 2026-11-30, 1,000 with the read-back check)."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path

import pytest
from mutations import mutate_file

from ckptgate.consolidate import plan_for
from ckptgate.consolidate.writer import INDEX_NAME, write_plan
from ckptgate.decide.decision import Decision
from ckptgate.digest import fixture_digest
from ckptgate.errors import Error
from ckptgate.evidence.fixtures import Fixture
from ckptgate.evidence.gates import fixture_adapter
from ckptgate.inspect import SafeTree, inspect_open_tree
from ckptgate.pipeline import open_sources

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "data"
REPO = Path(__file__).resolve().parents[1]
NAMES = sorted(p.name for p in FIXTURES.iterdir() if (p / "checkpoint").is_dir())


def _planned(name: str) -> bool:
    """Whether the fixture's unchanged checkpoint is planned and written, from the data: the gates
    data names an adapter for the format it is known by (not ``fsdp-local``), unless the fixture
    records one of the producer quirks the gate refuses by design: a PEFT base left unpinned
    (``base_model.revision`` null [R16]), or DCP HF storage with non-tensor items (each such rank
    file starts with ``torch.save`` zips, which inspection refuses).  The mutations of a planned
    fixture start from a checkpoint that reaches every stage."""
    fixture = Fixture.load(FIXTURES / name)
    meta = fixture.meta
    if fixture_adapter(REPO, fixture) is None:
        return False
    if (meta.get("base_model") or {}).get("revision", "") is None:
        return False
    return not (meta["format"] == "dcp-hf-safetensors" and meta.get("non_tensor_items"))

SEEDS = int(os.environ.get("CKPTGATE_MUTATION_SEEDS", "24"))  # more for a longer hunt
CODE = re.compile(r"[a-z0-9_]+(\.[a-z0-9_]+)+")
#: Every loader but a framework one: a checkpoint that would need the worker gets a typed refusal.
ALLOW = Decision(allow=True, plane="static_pickle",
                 permitted_loaders=("deepspeed", "json", "safetensors", "static_pickle"), required_controls=(),
                 reasons=(), decision_id="mutations", policy_revision="test", engine="test")


def _outcome(root: Path, out: Path) -> str:
    """``ok``, ``refused`` (error findings) or the typed error's code; anything else raises."""
    try:
        with SafeTree.open(root) as tree:
            inspection = inspect_open_tree(tree)
            if any(f.severity == "error" for f in inspection.findings):
                assert all(CODE.fullmatch(f.code) for f in inspection.findings)
                return "refused"
            digest = fixture_digest(tree)
            # The digest string, not its manifest: a plan that would need the worker is refused.
            plan = plan_for(inspection, decision=ALLOW, max_shard_bytes=4096)
            with open_sources(tree, plan) as fds:
                write_plan(plan, out, fds, expected=digest.file_hashes())
    except Error as e:
        assert CODE.fullmatch(e.code), e.code
        return e.code
    _readable_as_planned(plan, out)
    return "ok"


def _readable_as_planned(plan, out: Path) -> None:
    """What was written is what the plan says, as the ``safetensors`` library reads it, and the
    index maps every tensor to its file."""
    from safetensors import safe_open

    where = {}
    for task in plan.shards:
        with safe_open(str(out / task.filename), "numpy") as f:  # slices only: any dtype
            assert sorted(f.keys()) == sorted(t.name for t in task.tensors)
            for t in task.tensors:
                got = f.get_slice(t.name)
                assert (got.get_dtype(), tuple(got.get_shape())) == (t.dtype, tuple(t.shape)), t.name
                where[t.name] = task.filename
    if plan.write_index and plan.shards:
        index = json.loads((out / INDEX_NAME).read_text())
        assert index["weight_map"] == where



def _copy(name: str, dst: Path) -> Path:
    """The fixture's checkpoint (a run's selected ``checkpoint-N/``, the folder the gate takes in).
    DeepSpeed's helper scripts are left out: the policy excepts them by name, inspection does not."""
    shutil.copytree(Fixture.load(FIXTURES / name).checkpoint, dst, ignore=shutil.ignore_patterns("*.py"))
    return dst


def _mutated(name: str, seed: int, tmp_path: Path) -> tuple[Path, str]:
    rng = random.Random(f"{name}:{seed}")
    root = _copy(name, tmp_path / f"{name}-{seed}")
    files = sorted(p for p in root.rglob("*") if p.is_file())
    victim = rng.choice(files)
    hows = []
    for _ in range(rng.choice([1, 1, 1, 2])):
        data, how = mutate_file(victim, rng)
        victim.write_bytes(data)
        hows.append(how)
    return root, f"{victim.relative_to(root)}: {'; '.join(hows)}"


@pytest.mark.parametrize("name", NAMES)
def test_unchanged_fixture_reaches_the_writer(name: str, tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    got = _outcome(_copy(name, tmp_path / "ckpt"), tmp_path / "out")
    assert (got == "ok") == _planned(name), got


@pytest.mark.parametrize("name", NAMES)
def test_mutated_fixture_ends_in_findings_or_a_typed_error(name: str, tmp_path: Path) -> None:
    outcomes = {}
    for seed in range(SEEDS):
        root, how = _mutated(name, seed, tmp_path)
        out = tmp_path / f"out-{seed}"
        out.mkdir()
        try:
            outcomes[seed] = _outcome(root, out)
        except Exception as e:  # noqa: BLE001 - the point: name the case that escaped
            pytest.fail(f"{name} seed {seed} ({how}): {type(e).__name__}: {e}")
    assert set(outcomes.values()) - {"ok"}, f"no mutation of {name} was refused: {outcomes}"
