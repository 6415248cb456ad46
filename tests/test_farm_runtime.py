"""The farm's runtime environments (issue #31 item 2): the runtime kind of lock, the per-checkout link
with its runtime record, and how a runtime lock's qualifications are chosen and found in the matrix.

Nothing is installed: the environment is a folder with an empty site-packages, and the link is a
venv over it made with this interpreter.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ckptgate.evidence import environment as envrec
from ckptgate.evidence.errors import EvidenceError
from tests.test_farm import farm

rt = sys.modules["farm_runtime"]

RUNTIME = """# a runtime lock
kind = "runtime"
python = "3.11.7"
requirements = ["torch==2.10.0", "pyseccomp==0.1.2"]

[qualify]
deepspeed_zero3 = "deepspeed-zero"
deepspeed_zero2 = "deepspeed-zero"

[lock]
"pyseccomp" = "0.1.2"
"setuptools" = "84.2.1"
"torch" = "2.10.0"
"""


def _write(tmp_path: Path, text: str, name: str = "runtime-torch-2.10.0.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_a_runtime_lock_qualifies_committed_fixtures_and_round_trips(tmp_path: Path) -> None:
    lock = farm.parse_lock(_write(tmp_path, RUNTIME))
    assert lock.kind == "runtime" and lock.fixtures == ()
    assert lock.qualify == (
        farm.QualifyJob(fixture="deepspeed_zero3", adapter="deepspeed-zero"),
        farm.QualifyJob(fixture="deepspeed_zero2", adapter="deepspeed-zero"),
    )
    again = farm.parse_lock(_write(tmp_path, farm.render_lock(lock, "a runtime lock")))
    assert again == lock and again.digest == lock.digest
    # [qualify] is not part of the environment: listing another fixture reuses it
    more = farm.parse_lock(_write(tmp_path, RUNTIME.replace("[lock]", 'fsdp_full = "fsdp-full"\n\n[lock]')))
    assert more.digest == lock.digest and len(more.qualify) == 3


@pytest.mark.parametrize(
    ("old", "new", "says"),
    [
        ('kind = "runtime"', 'kind = "consumer"', "one of producer, runtime"),
        ('kind = "runtime"\n', "", "belongs to a runtime lock"),
        ("[qualify]", '[fixtures]\nx = { spec = "s", adapter = "a" }\n\n[qualify]', "writes no fixtures"),
        ('deepspeed_zero3 = "deepspeed-zero"\ndeepspeed_zero2 = "deepspeed-zero"\n', "", "needs [qualify]"),
        ('deepspeed_zero3 = "deepspeed-zero"', 'deepspeed_zero3 = ""', "map it to an adapter"),
        ('["torch==2.10.0", "pyseccomp==0.1.2"]', '["pyseccomp==0.1.2"]', "pins torch"),
    ],
)
def test_bad_runtime_locks_are_refused_naming_the_cause(tmp_path: Path, old: str, new: str, says: str) -> None:
    assert old in RUNTIME
    with pytest.raises(farm.FarmError, match=says.replace("[", r"\[")):
        farm.parse_lock(_write(tmp_path, RUNTIME.replace(old, new, 1)))


def test_committed_runtime_locks_pin_the_torch_they_are_named_for_and_ckptgates_core() -> None:
    core = ("cryptography", "sigstore", "safetensors", "pyseccomp", "jsonschema", "numpy", "deepspeed")
    runtimes = [lk for lk in farm.load_locks() if lk.kind == "runtime"]
    assert {lk.version("torch") for lk in runtimes} >= {"2.10.0", "2.11.0", "2.12.1", "2.14.1", "2.15.0"}
    for lk in runtimes:
        assert lk.env == f"runtime-torch-{lk.version('torch')}"
        assert all(lk.version(name) for name in core), lk.env
        assert "ckptgate" not in lk.packages  # linked from the checkout, never installed from the lock
        assert lk.qualify and all(q.adapter == "deepspeed-zero" for q in lk.qualify)
        for q in lk.qualify:
            assert (farm.FIXTURES / q.fixture / "meta.json").is_file(), q.fixture


def test_the_runtime_record_name_is_the_one_ckptgate_reads() -> None:
    assert rt.RUNTIME_RECORD == envrec.RUNTIME_RECORD


def _fake_env(tmp_path: Path) -> Path:
    prefix = tmp_path / "env"
    (prefix / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages").mkdir(parents=True)
    return prefix


def test_the_link_is_per_checkout_and_records_its_runtime_lock(tmp_path: Path) -> None:
    prefix = _fake_env(tmp_path)
    root = tmp_path / "checkout"
    (root / "src").mkdir(parents=True)
    link = rt.link_dir(tmp_path / "home", "runtime-torch-2.10.0-0123456789abcdef", root)
    assert link != rt.link_dir(tmp_path / "home", "runtime-torch-2.10.0-0123456789abcdef", tmp_path / "other")
    sha = "ab" * 32
    exe = rt.link_runtime(env_prefix=prefix, link=link, python=sys.executable, root=root,
                          lock_name="runtime-torch-2.10.0", lock_sha256=sha)
    assert exe == link / "bin" / "ckptgate" and exe.read_text().startswith(f"#!{link / 'bin' / 'python'}\n")
    pth = (rt.site_packages(link) / rt.LINK_PTH).read_text().splitlines()
    assert pth == [str(rt.site_packages(prefix)), str(root / "src")]
    # the interpreter of the link finds the record at its prefix, as ckptgate's environment() does
    out = subprocess.run([str(link / "bin" / "python"), "-c", "import sys; print(sys.prefix)"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert envrec.runtime_record(Path(out)) == {"lock": "runtime-torch-2.10.0", "lock_sha256": sha}
    # a link already current is kept; another lock digest remakes it
    stamp = (link / "bin" / "python").stat().st_ino
    rt.link_runtime(env_prefix=prefix, link=link, python=sys.executable, root=root,
                    lock_name="runtime-torch-2.10.0", lock_sha256=sha)
    assert (link / "bin" / "python").stat().st_ino == stamp
    rt.link_runtime(env_prefix=prefix, link=link, python=sys.executable, root=root,
                    lock_name="runtime-torch-2.10.0", lock_sha256="cd" * 32)
    assert envrec.runtime_record(link)["lock_sha256"] == "cd" * 32  # type: ignore[index]


@pytest.mark.parametrize(
    "text",
    ['{"lock": "runtime-torch-2.10.0"}', '{"lock": "../x", "lock_sha256": "' + "ab" * 32 + '"}', "not json",
     '{"lock": "r", "lock_sha256": "' + "ab" * 32 + '", "torch": "2.10.0"}'],
)
def test_a_malformed_runtime_record_is_refused_and_none_is_ckptgates_own(tmp_path: Path, text: str) -> None:
    assert envrec.runtime_record(tmp_path) is None
    (tmp_path / envrec.RUNTIME_RECORD).write_text(text)
    with pytest.raises(EvidenceError) as e:
        envrec.runtime_record(tmp_path)
    assert e.value.code == "evidence.qualify.runtime_record"


def test_environment_names_the_runtime_and_reads_torch_from_the_installed_distribution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert "runtime" not in envrec.environment()  # the project's own environment has no record
    (tmp_path / envrec.RUNTIME_RECORD).write_text(rt.record_text("runtime-torch-2.10.0", "ab" * 32))
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    env = envrec.environment()
    assert env["runtime"] == {"lock": "runtime-torch-2.10.0", "lock_sha256": "ab" * 32}
    assert envrec.runtime_lock(env) == "runtime-torch-2.10.0" and envrec.runtime_lock({"torch": "2.13.0"}) is None
    import importlib.metadata

    assert env["torch"] == importlib.metadata.version("torch")  # never the lock's name for it


def test_runtime_rows_are_those_of_that_runtime_only(tmp_path: Path) -> None:
    support = tmp_path / "support.json"
    rows = [
        {"fixture_digest": "sha256:a", "status": "supported", "environment": {"torch": "2.13.0"}},
        {"fixture_digest": "sha256:a", "status": "refused",
         "environment": {"torch": "2.10.0", "runtime": {"lock": "runtime-torch-2.10.0"}}},
        {"fixture_digest": "sha256:a", "status": "supported",
         "environment": {"torch": "2.15.0", "runtime": {"lock": "runtime-torch-2.15.0"}}},
    ]
    support.write_text(json.dumps({"rows": rows}))
    assert rt.runtime_rows(support, "sha256:a", "runtime-torch-2.10.0") == ["refused"]
    assert rt.runtime_rows(support, "sha256:b", "runtime-torch-2.10.0") == []
    assert rt.runtime_rows(tmp_path / "missing.json", "sha256:a", "runtime-torch-2.10.0") == []


def test_a_runtime_lock_is_qualified_only_once_its_environment_is_built(tmp_path: Path) -> None:
    lock = farm.parse_lock(_write(tmp_path, RUNTIME))
    assert farm.qualifications([lock], tmp_path) == []
    target = farm.env_dir(lock, tmp_path)
    target.mkdir(parents=True)
    (target / farm.STAMP).write_text(lock.digest + "\n")
    got = farm.qualifications([lock], tmp_path)
    assert [(q.fixture, q.adapter) for q in got] == [("deepspeed_zero3", "deepspeed-zero"),
                                                     ("deepspeed_zero2", "deepspeed-zero")]
    assert farm.seccomp_facts_path(lock, tmp_path) == tmp_path / "runtime-torch-2.10.0.json"


def test_traced_commands_run_under_strace_with_pid_translation(tmp_path: Path) -> None:
    cmd = rt.traced(["ckptgate", "qualify"], tmp_path / "t.strace")
    assert cmd[: len(rt.STRACE)] == list(rt.STRACE) and "--pidns-translation" in cmd
    assert cmd[-2:] == ["ckptgate", "qualify"] and str(tmp_path / "t.strace") in cmd


def test_a_failed_qualification_still_names_its_status_and_digest() -> None:
    evidence = {"status": "error", "fixture_digest": "sha256:a"}
    failed = {"error": {"code": "evidence.qualify.failed", "evidence": evidence}}
    assert farm.qualify_result(json.dumps(failed)) == {"status": "error", "fixture_digest": "sha256:a"}
    assert farm.qualify_result(json.dumps({"status": "passed", "fixture_digest": "sha256:b"}))["status"] == "passed"
    refused = {"error": {"code": "policy.denied", "evidence": {"reasons": []}}}
    assert farm.qualify_result(json.dumps(refused)) == {} and farm.qualify_result("not json") == {}
