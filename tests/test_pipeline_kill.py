"""``kill -9`` at any moment of an intake: publication holds, and once one more run has started,
nothing the killed runs made remains (no work directory, no staging directory, no registry
entry), wherever their DST was.  No private key is on disk at any of those moments."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.pipeline_helpers import demo_attested

KILLS = 20


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """A 192 MiB HF sharded checkpoint (hashing and copying take a moment), trusted and attested."""
    import torch
    from huggingface_hub import save_torch_state_dict

    root = tmp_path_factory.mktemp("kill-ckpt")
    src = root / "ckpt"
    state = {f"layers.{i}.weight": torch.full((2048, 4096), float(i)) for i in range(6)}
    src.mkdir()
    save_torch_state_dict(state, str(src), max_shard_size=64 << 20)
    attested = demo_attested(src, root)
    return {"src": src, "trust": attested.trust, "att": attested.attestation}


def _intake(big, dst: Path, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "ckptgate", "intake", str(big["src"]), "--out", str(dst),
                             "--attestation", str(big["att"]), "--trust", str(big["trust"]), "--json"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


def _private_keys(root: Path) -> list[Path]:
    found = []
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = Path(dirpath, name)
            try:
                if b"PRIVATE KEY" in p.read_bytes():
                    found.append(p)
            except OSError:
                pass  # removed meanwhile
    return found


def _staging(parent: Path) -> list[Path]:
    return [p for p in parent.iterdir() if ".ckptgate-staging-" in p.name]


def _work_dirs(*roots: Path) -> set[Path]:
    """Every embedded-OPA work directory under ``roots``, whatever version made it."""
    return {p for root in roots for p in root.rglob("*")
            if p.is_dir() and p.name.startswith(("opa-", "ckptgate-opa-"))}


def test_intakes_killed_at_20_moments_leave_nothing_after_one_more_run(big, tmp_path):
    run, tmp, state = tmp_path / "run", tmp_path / "tmp", tmp_path / "state"
    run.mkdir(mode=0o700)
    tmp.mkdir()
    env = {**os.environ, "XDG_RUNTIME_DIR": str(run), "TMPDIR": str(tmp), "XDG_STATE_HOME": str(state)}
    killed = tmp_path / "killed"
    killed.mkdir()

    started = time.monotonic()
    assert _intake(big, tmp_path / "measured", env).wait(timeout=300) == 0
    full = time.monotonic() - started  # start-up, hashing and copying, on this machine now
    print(f"a full intake took {full:.2f} s")

    published, left_work, left_staging = [], set(), set()  # DST is absent, or complete with its receipt
    for i in range(KILLS):
        dst = killed / f"out-{i}"
        proc = _intake(big, dst, env)
        time.sleep(full * (i + 0.5) / KILLS)  # spread evenly from start-up to the last copy
        proc.kill()
        proc.wait(timeout=60)
        if dst.exists():  # published before the kill landed: complete, with its receipt
            published.append(dst)
            assert (dst / "ckptgate-receipt.json").is_file()
        assert _private_keys(run) == [] and _private_keys(tmp) == [] and _private_keys(state) == []
        left_work |= _work_dirs(run, tmp)
        left_staging |= set(_staging(killed))
    assert left_work and left_staging  # the kills did leave work and partial output behind

    other = tmp_path / "elsewhere"
    other.mkdir()
    assert _intake(big, other / "out", env).wait(timeout=300) == 0  # into another parent: found by the registry

    assert _work_dirs(run, tmp) == set()
    assert _staging(killed) == [] and sorted(killed.iterdir()) == sorted(published)
    assert sorted(p.name for p in other.iterdir()) == ["out"]
    assert list((state / "ckptgate" / "live").iterdir()) == []
