"""scripts/farm.py's pure logic: lock parsing, the cache key, and what a rerun skips.

No environment is built here (a farm run takes hours); the committed locks are parsed, and the
resumability decisions are checked on small files in ``tmp_path``.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _load():  # scripts/farm.py is a script, not a package
    spec = importlib.util.spec_from_file_location("ckptgate_farm_script", REPO / "scripts" / "farm.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


farm = _load()

LOCK = """# a test lock
python = "3.11.7"
requirements = ["deepspeed==0.18.9", "torch==2.13.0"]

[fixtures]
deepspeed_zero3_x = { spec = "deepspeed_zero3", adapter = "deepspeed-zero" }

[lock]
"deepspeed" = "0.18.9"
"torch" = "2.13.0"
"typing-extensions" = "4.16.0"
"""


def _write(tmp_path: Path, text: str, name: str = "ds-0.18.9.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_committed_locks_parse_and_pin_every_requirement() -> None:
    locks = farm.load_locks()
    assert locks, "no committed lock under qualification/locks/"
    for lock in locks:
        assert len(lock.packages) > len(lock.requirements)  # transitive packages are locked too
        for req in lock.requirements:
            name, version = req.split("==")
            assert lock.version(name) == version
        assert lock.fixtures or lock.qualify  # a producer lock writes fixtures, a runtime lock qualifies some
        # sdists (DeepSpeed) are built without isolation: their build tools must be in the env
        assert all(tool in lock.packages for tool in farm.BUILD_TOOLS)


def test_parse_lock_reads_every_field(tmp_path: Path) -> None:
    lock = farm.parse_lock(_write(tmp_path, LOCK))
    assert lock.env == "ds-0.18.9" and lock.python == "3.11.7"
    job = farm.FixtureJob(name="deepspeed_zero3_x", spec="deepspeed_zero3", adapter="deepspeed-zero")
    assert lock.fixtures == (job,)
    assert lock.version("Typing_Extensions") == "4.16.0"
    assert lock.requirement_lines() == ["deepspeed==0.18.9", "torch==2.13.0", "typing-extensions==4.16.0"]
    # render -> parse is the identity (the `lock` command rewrites the file this way)
    again = farm.parse_lock(_write(tmp_path, farm.render_lock(lock, "a test lock"), "ds-0.18.9.toml"))
    assert again == lock and again.digest == lock.digest


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        ('python = "3.11.7"', 'python = "3.11"', "exact version"),
        ('python = "3.11.7"\n', "", "exact version"),
        ('"torch" = "2.13.0"', '"torch" = ">=2.13"', "not an exact version"),
        ('"typing-extensions" = "4.16.0"', '"typing_extensions" = "4.16.0"', "normalised"),
        ('"torch" = "2.13.0"', '"torch" = "2.12.0"', "not what [lock] holds"),
        ('["deepspeed==0.18.9", "torch==2.13.0"]', '["deepspeed>=0.18"]', "name==version"),
        ('adapter = "deepspeed-zero"', 'adapter = ""', "must be {spec"),
        ("[lock]", "[lock]\n[extra]", "unknown keys"),
        ("deepspeed_zero3_x =", "Bad-Name =", "must be {spec"),
    ],
)
def test_bad_locks_are_refused_naming_the_cause(tmp_path: Path, old: str, new: str, says: str) -> None:
    assert old in LOCK
    with pytest.raises(farm.FarmError, match=says.replace("[", r"\[").replace("{", r"\{")):
        farm.parse_lock(_write(tmp_path, LOCK.replace(old, new, 1)))


def test_a_lock_without_packages_says_how_to_make_them(tmp_path: Path) -> None:
    text = LOCK.split("[lock]")[0]
    with pytest.raises(farm.FarmError, match=r"farm.py lock ds-0.18.9"):
        farm.parse_lock(_write(tmp_path, text))


def test_unreadable_toml_is_a_farm_error(tmp_path: Path) -> None:
    with pytest.raises(farm.FarmError, match="cannot read the lock"):
        farm.parse_lock(_write(tmp_path, LOCK + "\n[lock\n"))


def test_the_cache_key_follows_python_and_packages_only(tmp_path: Path) -> None:
    base = farm.parse_lock(_write(tmp_path, LOCK))
    # the fixtures list and the comments are not part of the environment
    same = farm.parse_lock(_write(tmp_path, LOCK.replace("# a test lock", "# other").replace(
        "deepspeed_zero3_x =", "deepspeed_zero3_y =")))
    assert same.digest == base.digest and same.key == base.key
    # a transitive package or the interpreter is
    dep = farm.parse_lock(_write(tmp_path, LOCK.replace('"4.16.0"', '"4.16.1"')))
    py = farm.parse_lock(_write(tmp_path, LOCK.replace('"3.11.7"', '"3.11.8"')))
    assert len({base.digest, dep.digest, py.digest}) == 3
    assert base.key == f"ds-0.18.9-{base.digest[:16]}"
    assert farm.env_dir(base, tmp_path) == tmp_path / "envs" / base.key


def test_parse_compiled_takes_pins_and_refuses_anything_else() -> None:
    text = "# header\ntorch==2.13.0\n    # via deepspeed\nTyping_Extensions==4.16.0 \\\n    --hash=sha256:ab\n"
    assert farm.parse_compiled(text) == {"torch": "2.13.0", "typing-extensions": "4.16.0"}
    for bad in ("torch>=2.13\n", "-e ./src\n", "torch @ https://example.invalid/t.whl\n"):
        with pytest.raises(farm.FarmError, match="not an exact"):
            farm.parse_compiled(bad)


def test_an_environment_is_ready_only_with_its_own_digest_stamp(tmp_path: Path) -> None:
    lock = farm.parse_lock(_write(tmp_path, LOCK))
    assert not farm.env_ready(lock, tmp_path)
    d = farm.env_dir(lock, tmp_path)
    d.mkdir(parents=True)
    assert not farm.env_ready(lock, tmp_path)  # an interrupted build has no stamp
    (d / farm.STAMP).write_text("0" * 64 + "\n")
    assert not farm.env_ready(lock, tmp_path)
    (d / farm.STAMP).write_text(lock.digest + "\n")
    assert farm.env_ready(lock, tmp_path)


def _fixture(root: Path, lock, job, *, lock_sha256: str | None = None) -> Path:
    d = root / job.name
    (d / "checkpoint").mkdir(parents=True)
    (d / "checkpoint" / "a.pt").write_bytes(b"12345")
    (d / "expected.safetensors").write_bytes(b"x")
    meta = {"farm": {"environment": lock.env, "lock": "l", "lock_sha256": lock_sha256 or lock.digest, "spec": job.spec},
            "checkpoint_files": {"a.pt": {"size": 5, "sha256": "-"}}}
    (d / "meta.json").write_text(json.dumps(meta))
    return d


def test_a_fixture_is_reused_only_when_made_by_the_same_lock_and_whole(tmp_path: Path) -> None:
    lock = farm.parse_lock(_write(tmp_path, LOCK))
    job = lock.fixtures[0]
    fixtures = tmp_path / "data"
    assert not farm.fixture_current(lock, job, fixtures)  # not there
    d = _fixture(fixtures, lock, job)
    assert farm.fixture_current(lock, job, fixtures)
    moved = farm.FixtureJob(name=job.name, spec="deepspeed_zero2", adapter=job.adapter)
    assert not farm.fixture_current(lock, moved, fixtures)  # the lock now names another producer spec
    (d / "checkpoint" / "a.pt").write_bytes(b"123")  # truncated
    assert not farm.fixture_current(lock, job, fixtures)
    other = tmp_path / "other"
    _fixture(other, lock, job, lock_sha256="f" * 64)  # made by another lock
    assert not farm.fixture_current(lock, job, other)


def test_load_locks_names_the_missing_environment(tmp_path: Path) -> None:
    _write(tmp_path, LOCK)
    assert [lk.env for lk in farm.load_locks(locks=tmp_path)] == ["ds-0.18.9"]
    with pytest.raises(farm.FarmError, match=r"no lock for \['nope'\].*known: ds-0.18.9"):
        farm.load_locks(["nope"], locks=tmp_path)


def test_summary_table_has_a_row_per_environment() -> None:
    o = farm.Outcome(env="ds", generated=["a"], reused=["b"], failed=[], rows={"a": ["supported"], "b": []},
                     seconds=12.4, disk="1G", note="")
    table = farm.summary([o]).splitlines()
    assert table[0].startswith("| environment | fixtures")
    assert table[2] == "| ds | 1 / 1 / 0 | 1 | 12s | 1G |  |"


def test_a_failure_kept_at_the_same_lock_is_not_rerun_unless_asked(tmp_path: Path) -> None:
    lock = farm.parse_lock(_write(tmp_path, LOCK))
    job = lock.fixtures[0]
    fixtures, attempts = tmp_path / "data", tmp_path / "attempts"
    attempts.mkdir()
    assert farm.todo_fixtures(lock, retry_failed=False, fixtures=fixtures, attempts=attempts) == ([job], [])
    farm.attempt_log(lock, job.name, attempts).write_text("rc=1\n")
    assert farm.todo_fixtures(lock, retry_failed=False, fixtures=fixtures, attempts=attempts) == ([], [job])
    assert farm.todo_fixtures(lock, retry_failed=True, fixtures=fixtures, attempts=attempts) == ([job], [])
    # a failure kept for another lock digest does not count for this one
    other = farm.parse_lock(_write(tmp_path, LOCK.replace('"4.16.0"', '"4.16.1"')))
    assert farm.todo_fixtures(other, retry_failed=False, fixtures=fixtures, attempts=attempts) == ([job], [])
    # a failed build stops every fixture of that lock until retried
    farm.attempt_log(lock, job.name, attempts).unlink()
    farm.attempt_log(lock, "build", attempts).write_text("rc=2\n")
    assert farm.todo_fixtures(lock, retry_failed=False, fixtures=fixtures, attempts=attempts) == ([], [job])
    # a fixture current at this lock is neither, whatever was kept
    _fixture(fixtures, lock, job)
    assert farm.todo_fixtures(lock, retry_failed=False, fixtures=fixtures, attempts=attempts) == ([], [])


def test_failed_qualifications_are_kept_only_after_every_fixture_was_qualified(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure log kept in the repository mid-run would make the tree dirty for every later
    `ckptgate qualify` (which then refuses with evidence.qualify.dirty_tree, not qualifying at all)."""
    two = LOCK.replace('adapter = "deepspeed-zero" }', 'adapter = "deepspeed-zero" }\n'
                       'deepspeed_zero3_y = { spec = "deepspeed_zero3", adapter = "deepspeed-zero" }')
    lock = farm.parse_lock(_write(tmp_path, two))
    assert [j.name for j in lock.fixtures] == ["deepspeed_zero3_x", "deepspeed_zero3_y"]
    events: list[tuple[str, str]] = []

    def fake_ckptgate(*args: str, exe=None, trace=None):
        if args[0] == "qualify":
            name = args[args.index("--fixture") + 1]
            events.append(("qualify", name))
            return farm.subprocess.CompletedProcess(args, 4, stdout='{"error": {}}', stderr="")
        return farm.subprocess.CompletedProcess(args, 0, stdout="", stderr="")

    def fake_retain(lk, step: str, log_path: Path) -> Path:
        assert log_path.is_file()
        events.append(("keep", step))
        return farm.ROOT / "qualification" / "attempts" / f"{lk.key}-{step}.log"

    monkeypatch.setattr(farm, "ckptgate", fake_ckptgate)
    monkeypatch.setattr(farm, "retain_attempt", fake_retain)
    monkeypatch.setattr(farm, "fixture_current", lambda lk, job, fixtures=None: True)
    monkeypatch.setattr(farm, "dirty", lambda *a, **k: [])
    monkeypatch.setattr(farm, "matrix_rows", lambda digest: [])
    outcomes = {lock.env: farm.Outcome(env=lock.env)}
    assert farm.qualify_all([lock], outcomes, False, tmp_path / "home")
    assert events == [("qualify", "deepspeed_zero3_x"), ("qualify", "deepspeed_zero3_y"),
                      ("keep", "deepspeed_zero3_x-qualify"), ("keep", "deepspeed_zero3_y-qualify")]
    assert outcomes[lock.env].note.count("failed: qualification/attempts/") == 2


SAME = LOCK.replace('deepspeed_zero3_x = { spec = "deepspeed_zero3", adapter = "deepspeed-zero" }',
                    'deepspeed_zero3_x = { spec = "deepspeed_zero3", adapter = "deepspeed-zero", '
                    'same_bytes_as = "deepspeed_zero3" }')


def test_same_bytes_as_parses_renders_and_names_the_committed_fixture(tmp_path: Path) -> None:
    lock = farm.parse_lock(_write(tmp_path, SAME))
    [job] = lock.fixtures
    assert (job.same_bytes_as, job.committed) == ("deepspeed_zero3", "deepspeed_zero3")
    want = tmp_path / "data" / "deepspeed_zero3" / "written_by" / "deepspeed_zero3_x.json"
    assert farm.record_path(job, tmp_path / "data") == want
    assert farm.parse_lock(_write(tmp_path, farm.render_lock(lock, "h"), "again.toml")).fixtures == lock.fixtures
    for bad in ('same_bytes_as = "deepspeed_zero3_x"', 'same_bytes_as = "Bad Name"', 'other = "x"'):
        text = SAME.replace('same_bytes_as = "deepspeed_zero3"', bad)
        with pytest.raises(farm.FarmError, match="deepspeed_zero3_x"):
            farm.parse_lock(_write(tmp_path, text, "bad.toml"))


def _produced(root: Path, files: dict, truth: str = "t") -> Path:
    root.mkdir(parents=True)
    (root / "meta.json").write_text(json.dumps({"checkpoint_files": files, "expected": {"sha256": truth},
                                                "farm": {"lock_sha256": "x", "spec": "deepspeed_zero3"}}))
    return root


def test_a_same_bytes_output_is_kept_as_a_record_only_when_its_bytes_are_the_fixtures(tmp_path: Path) -> None:
    lock = farm.parse_lock(_write(tmp_path, SAME))
    [job] = lock.fixtures
    fixtures = tmp_path / "data"
    target = fixtures / "deepspeed_zero3"
    (target / "checkpoint").mkdir(parents=True)
    (target / "checkpoint" / "a.pt").write_bytes(b"12345")
    (target / "expected.safetensors").write_bytes(b"x")
    files = {"a.pt": {"size": 5, "sha256": "s"}}
    (target / "meta.json").write_text(json.dumps({"checkpoint_files": files, "expected": {"sha256": "t"}}))
    log = tmp_path / "log"
    with log.open("w") as logf, pytest.raises(farm.StepFailed, match="not the bytes of deepspeed_zero3"):
        farm.keep_record(job, _produced(tmp_path / "p1", {"a.pt": {"size": 5, "sha256": "other"}}), logf, log, fixtures)
    assert "files differ ['a.pt']" in log.read_text()
    with log.open("w") as logf, pytest.raises(farm.StepFailed):
        farm.keep_record(job, _produced(tmp_path / "p2", files, truth="other truth"), logf, log, fixtures)
    assert not farm.record_path(job, fixtures).exists()
    with log.open("w") as logf:
        kept = farm.keep_record(job, _produced(tmp_path / "p3", files), logf, log, fixtures)
    assert kept.read_bytes() == (tmp_path / "p3" / "meta.json").read_bytes()
    # current only when the record names this very lock and spec
    assert not farm.fixture_current(lock, job, fixtures)
    record = json.loads(kept.read_text())
    record["farm"]["lock_sha256"] = lock.digest
    kept.write_text(json.dumps(record))
    assert farm.fixture_current(lock, job, fixtures)
    (target / "meta.json").write_text(json.dumps({"checkpoint_files": files, "expected": {"sha256": "new"}}))
    assert not farm.fixture_current(lock, job, fixtures)  # the committed fixture changed since


def test_two_runs_install_the_farms_uv_one_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two farm runs started together raced on installing uv into the same tool venv."""
    import threading
    import time

    active, peak, lock = [0], [0], threading.Lock()

    def fake_run(cmd, **_kw):
        if "install" in cmd:
            with lock:
                active[0] += 1
                peak[0] = max(peak[0], active[0])
            time.sleep(0.2)
            with lock:
                active[0] -= 1
        return type("Done", (), {"stdout": "", "returncode": 0})()

    monkeypatch.setattr(farm.subprocess, "run", fake_run)
    (tmp_path / "tools" / "bin").mkdir(parents=True)
    (tmp_path / "tools" / "bin" / "python").touch()
    threads = [threading.Thread(target=farm.uv, args=(tmp_path,)) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] == 1
