#!/usr/bin/env python3
"""The qualification farm: build each producer environment from its committed lock, generate the
fixtures with it, qualify them with ckptgate's own environment, and rebuild the matrix.

    python3 scripts/farm.py run [--only ENV ...] [--jobs N] [--commit]   # build, generate, qualify
    python3 scripts/farm.py lock ENV                                    # (re)resolve ENV's [lock]
    python3 scripts/farm.py status                                      # what is built, what is not

Each environment is one committed file, ``qualification/locks/<env>.toml``: the Python version,
the top-level requirements it was resolved from, the fixtures it produces, and ``[lock]``: the
exact version of every package (``uv pip compile`` output, transitive dependencies included).
The environment is installed with uv into ``$CKPTGATE_ENV_HOME/farm/envs/<env>-<digest>``
(default ``~/.cache/ckptgate``), keyed by the digest of the Python version and ``[lock]``; uv's
hard-linked cache lets environments that share a torch share its files on disk.

Resumable: an environment whose stamp holds its lock's digest is not rebuilt, and a fixture whose
``meta.json`` records the same lock digest is not regenerated.  Qualification needs a clean
committed tree: without ``--commit`` the run stops after generating and says what to commit; with
``--commit`` it commits the new fixtures itself (and afterwards the evidence and the matrix).
A failed build or producer run keeps its log under ``qualification/attempts/`` as evidence.

Only the standard library is used (it runs before any farm environment exists).  See
docs/qualification-farm.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import farm_runtime as rt  # a sibling script module, found through the line above

ROOT = Path(__file__).resolve().parent.parent
LOCKS = ROOT / "qualification" / "locks"
ATTEMPTS = ROOT / "qualification" / "attempts"
FIXTURES = ROOT / "tests" / "fixtures" / "data"
#: Per runtime environment, the measured calls of the contained worker after its seccomp filter
#: (scripts/seccomp_trace.py writes them; tests/enforce/test_seccomp_facts.py checks them).
SECCOMP_FACTS = ROOT / "qualification" / "seccomp"
SECCOMP_TRACE = ROOT / "scripts" / "seccomp_trace.py"
GENERATOR = ROOT / "tests" / "fixtures" / "generate.py"
PINS = ROOT / "pins.toml"
#: What `ckptgate qualify` and `ckptgate matrix build` write (ckptgate's layout `evidence_paths`):
#: evidence, not code, so it never makes the tree dirty for qualification.
EVIDENCE = ("attestations", "matrix", "policies/ckptgate/config/qualified/data.json")
#: Installed first, so that sdists importing torch at build time (DeepSpeed) build without isolation.
FIRST_PHASE = ("torch", "numpy", "setuptools", "wheel")
#: Always locked: sdists are built without isolation, against the environment's own packages.
BUILD_TOOLS = ("setuptools",)
#: Set for every install: DeepSpeed's ops are JIT-built when used, never at install time.
BUILD_ENV = {"DS_BUILD_OPS": "0"}
_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
_VERSION = re.compile(r"^[0-9][0-9a-zA-Z.+!-]*$")
_PYTHON = re.compile(r"^3\.[0-9]+\.[0-9]+$")
_FIXTURE = re.compile(r"^[a-z0-9_]+$")
_REQ = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)")


class FarmError(Exception):
    """A bad lock or a failed farm step; the message names the cause and the next step."""


def log(msg: str) -> None:
    print(f"[farm] {msg}", file=sys.stderr, flush=True)


def normalize(name: str) -> str:
    """PEP 503 name normalisation (``Huggingface_Hub`` -> ``huggingface-hub``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True, slots=True)
class FixtureJob:
    """One fixture an environment produces: committed as ``name``, made by generator spec ``spec``
    (``tests/fixtures/generate.py --only SPEC``), qualified with ``adapter``.

    With ``same_bytes_as``, the environment is expected to write exactly the bytes of that
    committed fixture (another release of the same producer): its output is compared with that
    fixture's manifest and ground truth and, when equal, its ``meta.json`` is kept as a generation
    record ``<same_bytes_as>/written_by/<name>.json`` instead of a second copy of the bytes."""

    name: str
    spec: str
    adapter: str
    same_bytes_as: str | None = None

    @property
    def committed(self) -> str:
        """The fixture whose bytes are committed: this one, or the one it writes the same bytes as."""
        return self.same_bytes_as or self.name


@dataclass(frozen=True, slots=True)
class QualifyJob:
    """A committed fixture a runtime environment qualifies (``[qualify]``): ckptgate itself runs in
    that environment, so the contained worker's ``torch.load`` is that environment's torch."""

    fixture: str
    adapter: str


#: ``kind`` of a lock: ``producer`` environments write fixtures; ``runtime`` environments are ckptgate's
#: own dependencies (the core and the ``torch`` extra, plus DeepSpeed for its loader classes) at another
#: torch, with ckptgate linked from the checkout, and qualify committed framework-plane fixtures.
KINDS = ("producer", "runtime")


@dataclass(frozen=True, slots=True)
class Lock:
    """A parsed ``qualification/locks/<env>.toml``."""

    env: str
    python: str
    requirements: tuple[str, ...]
    fixtures: tuple[FixtureJob, ...]
    packages: Mapping[str, str] = field(repr=False)
    kind: str = "producer"
    qualify: tuple[QualifyJob, ...] = ()

    @property
    def digest(self) -> str:
        """sha256 of the Python version and every locked package: what the environment is keyed by.
        The fixtures list and the requirements it was resolved from are not part of it."""
        body = json.dumps({"python": self.python, "packages": dict(sorted(self.packages.items()))},
                          sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(body.encode()).hexdigest()

    @property
    def key(self) -> str:
        return f"{self.env}-{self.digest[:16]}"

    def version(self, package: str) -> str | None:
        return self.packages.get(normalize(package))

    def requirement_lines(self) -> list[str]:
        return [f"{n}=={v}" for n, v in sorted(self.packages.items())]


def parse_lock(path: Path) -> Lock:
    """Read and check one lock file; every problem is a :class:`FarmError` naming the file."""
    env = path.name.removesuffix(".toml")
    if not path.name.endswith(".toml") or not _NAME.match(env):
        raise FarmError(f"{path}: a lock is named <env>.toml with a lower-case environment name")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise FarmError(f"{path}: cannot read the lock ({e}); fix the TOML or restore it from git") from None
    unknown = set(data) - {"kind", "python", "requirements", "fixtures", "qualify", "lock"}
    if unknown:
        raise FarmError(f"{path}: unknown keys {sorted(unknown)}; a lock has kind, python, requirements, "
                        "fixtures (producer) or qualify (runtime), lock")
    kind = data.get("kind", "producer")
    if kind not in KINDS:
        raise FarmError(f"{path}: 'kind' must be one of {', '.join(KINDS)}, not {kind!r}")
    python = data.get("python")
    if not isinstance(python, str) or not _PYTHON.match(python):
        raise FarmError(f"{path}: 'python' must be an exact version such as \"3.11.7\", not {python!r}")
    reqs = data.get("requirements")
    if not isinstance(reqs, list) or not reqs or not all(isinstance(r, str) and _REQ.match(r) for r in reqs):
        raise FarmError(f"{path}: 'requirements' must list top-level pins as name==version")
    fixtures: list[FixtureJob] = []
    raw_fixtures = data.get("fixtures", {})
    if not isinstance(raw_fixtures, dict):
        raise FarmError(f"{path}: [fixtures] must map a fixture name to {{spec, adapter}}")
    for name, spec in raw_fixtures.items():
        well_formed = isinstance(spec, dict) and {"spec", "adapter"} <= set(spec) <= {
            "spec", "adapter", "same_bytes_as"} and all(isinstance(v, str) and v for v in spec.values())
        if not _FIXTURE.match(name) or not well_formed:
            raise FarmError(f"{path}: fixture {name!r} must be {{spec = \"<generator spec>\", "
                            f"adapter = \"<adapter>\"}}, optionally with same_bytes_as = \"<committed fixture>\"")
        same = spec.get("same_bytes_as")
        if same is not None and (not _FIXTURE.match(same) or same == name):
            raise FarmError(f"{path}: fixture {name!r}: same_bytes_as names another committed fixture, not {same!r}")
        fixtures.append(FixtureJob(name=name, spec=spec["spec"], adapter=spec["adapter"], same_bytes_as=same))
    qualify = _parse_qualify(path, kind, data.get("qualify"), fixtures)
    lock = data.get("lock")
    if not isinstance(lock, dict) or not lock:
        raise FarmError(f"{path}: no [lock] table; run `python3 scripts/farm.py lock {env}`")
    packages: dict[str, str] = {}
    for name, version in lock.items():
        if not isinstance(version, str) or not _VERSION.match(version):
            raise FarmError(f"{path}: [lock] {name} = {version!r} is not an exact version")
        norm = normalize(name)
        if norm != name or norm in packages:
            raise FarmError(f"{path}: [lock] {name!r} must be written once, normalised as {norm!r}")
        packages[norm] = version
    for req in reqs:
        m = _REQ.match(req)
        assert m is not None
        if packages.get(normalize(m.group(1))) != m.group(2):
            raise FarmError(f"{path}: requirement {req} is not what [lock] holds; "
                            f"run `python3 scripts/farm.py lock {env}`")
    if kind == "runtime" and ("torch" not in packages or not any(normalize(r.split("==")[0]) == "torch"
                                                                  for r in reqs)):
        raise FarmError(f"{path}: a runtime lock pins torch in its requirements (it is what the runtime row names)")
    return Lock(env=env, python=python, requirements=tuple(reqs), fixtures=tuple(fixtures), packages=packages,
                kind=kind, qualify=qualify)


def _parse_qualify(path: Path, kind: str, raw: object, fixtures: list[FixtureJob]) -> tuple[QualifyJob, ...]:
    """``[qualify]`` of a runtime lock: committed fixture name -> adapter; a producer lock has none,
    and a runtime lock writes no fixtures."""
    if kind == "producer":
        if raw is not None:
            raise FarmError(f"{path}: [qualify] belongs to a runtime lock (kind = \"runtime\"); "
                            "a producer lock lists what it writes under [fixtures]")
        return ()
    if fixtures:
        raise FarmError(f"{path}: a runtime lock writes no fixtures; list committed fixtures under [qualify]")
    if not isinstance(raw, dict) or not raw:
        raise FarmError(f"{path}: a runtime lock needs [qualify]: committed fixture name = \"<adapter>\"")
    jobs = []
    for name, adapter in raw.items():
        if not _FIXTURE.match(name) or not isinstance(adapter, str) or not adapter:
            raise FarmError(f"{path}: [qualify] {name!r} must name a fixture and map it to an adapter name")
        jobs.append(QualifyJob(fixture=name, adapter=adapter))
    return tuple(jobs)


def parse_compiled(text: str) -> dict[str, str]:
    """``uv pip compile`` output -> {normalised name: version}; comments and hashes are skipped,
    anything else that is not ``name==version`` is refused."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("--hash"):
            continue
        m = _REQ.match(line)
        if not m or line.rstrip("\\ ").strip() != m.group(0):
            raise FarmError(f"uv pip compile wrote {raw!r}, which is not an exact name==version pin")
        out[normalize(m.group(1))] = m.group(2)
    return out


def render_lock(lock: Lock, header: str) -> str:
    """The lock file's text (a fixed TOML shape, so the file diffs line by line)."""
    q = json.dumps
    lines = [f"# {h}".rstrip() for h in header.splitlines()]
    lines += [""] + ([f"kind = {q(lock.kind)}"] if lock.kind != "producer" else [])
    lines += [f"python = {q(lock.python)}", "requirements = ["]
    lines += [f"  {q(r)}," for r in lock.requirements]
    if lock.kind == "runtime":
        lines += ["]", "", "[qualify]"]
        lines += [f"{j.fixture} = {q(j.adapter)}" for j in lock.qualify]
    else:
        lines += ["]", "", "[fixtures]"]
        lines += [f"{f.name} = {{ spec = {q(f.spec)}, adapter = {q(f.adapter)}"
                  + (f", same_bytes_as = {q(f.same_bytes_as)}" if f.same_bytes_as else "") + " }"
                  for f in lock.fixtures]
    lines += ["", "[lock]"]
    lines += [f"{q(n)} = {q(v)}" for n, v in sorted(lock.packages.items())]
    return "\n".join(lines) + "\n"


# ---- the cache --------------------------------------------------------------------------------


def farm_home() -> Path:
    home = os.environ.get("CKPTGATE_ENV_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "ckptgate"
    )
    return Path(home) / "farm"


def env_dir(lock: Lock, home: Path) -> Path:
    return home / "envs" / lock.key


STAMP = ".ckptgate-farm-lock"


def env_ready(lock: Lock, home: Path) -> bool:
    """Built, completely, from exactly this lock (the stamp is written last and holds the digest)."""
    stamp = env_dir(lock, home) / STAMP
    return stamp.is_file() and stamp.read_text().strip() == lock.digest


WRITTEN_BY = "written_by"
"""The folder of a committed fixture that holds the generation records of the other environments
that wrote exactly its bytes (``<fixture>/written_by/<job name>.json``)."""


def record_path(job: FixtureJob, fixtures: Path = FIXTURES) -> Path:
    """Where a ``same_bytes_as`` job keeps its generation record (its environment's meta.json)."""
    assert job.same_bytes_as is not None
    return fixtures / job.same_bytes_as / WRITTEN_BY / f"{job.name}.json"


def _read_json(path: Path) -> dict | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def same_bytes(record: Mapping, meta: Mapping) -> bool:
    """Whether a generation record names exactly the committed fixture's files and ground truth."""
    files = record.get("checkpoint_files")
    expected = record.get("expected")
    return (isinstance(files, dict) and bool(files) and files == meta.get("checkpoint_files")
            and isinstance(expected, dict) and expected.get("sha256") == (meta.get("expected") or {}).get("sha256"))


def fixture_current(lock: Lock, job: FixtureJob, fixtures: Path = FIXTURES) -> bool:
    """The committed fixture ``job.name`` was generated by this lock (its meta.json says so) and
    every file its manifest lists is there with that size.  For a ``same_bytes_as`` job: its
    generation record names this lock and exactly the bytes of the fixture it names, and that
    fixture's files are there."""
    root = fixtures / job.committed
    meta = _read_json(root / "meta.json")
    made = _read_json(record_path(job, fixtures)) if job.same_bytes_as is not None else meta
    if meta is None or made is None or (job.same_bytes_as is not None and not same_bytes(made, meta)):
        return False
    farm = made.get("farm")
    if not isinstance(farm, dict) or farm.get("lock_sha256") != lock.digest or farm.get("spec") != job.spec:
        return False
    files = meta.get("checkpoint_files")
    if not isinstance(files, dict) or not (root / "expected.safetensors").is_file():
        return False
    return all((root / "checkpoint" / rel).is_file() and (root / "checkpoint" / rel).stat().st_size == f.get("size")
               for rel, f in files.items())


def load_locks(only: Sequence[str] = (), locks: Path = LOCKS) -> list[Lock]:
    found = {p.name.removesuffix(".toml"): p for p in sorted(locks.glob("*.toml"))}
    missing = [e for e in only if e not in found]
    if missing:
        raise FarmError(f"no lock for {missing} under {locks}; known: {', '.join(found) or 'none'}")
    return [parse_lock(found[e]) for e in (only or found)]


# ---- steps ------------------------------------------------------------------------------------


def uv(home: Path) -> Path:
    """uv from the farm's own tool venv (installed with pip at the pinned version on first use)."""
    pins = tomllib.loads(PINS.read_text())
    want = pins.get("farm", {}).get("uv")
    tools = home / "tools"
    binary = tools / "bin" / "uv"
    home.mkdir(parents=True, exist_ok=True)
    # one installer at a time: two farm runs started together raced on the same venv
    with (home / "tools.lock").open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        if binary.exists() and want and want in subprocess.run([str(binary), "--version"], capture_output=True,
                                                                  text=True, check=False).stdout:
            return binary
        if not (tools / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", str(tools)], check=True)
        spec = f"uv=={want}" if want else "uv"
        subprocess.run([str(tools / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        spec], check=True)
        return binary


def find_python(version: str) -> str:
    """The interpreter of exactly ``version``: pyenv's, else ``python3.X`` on PATH if it is that version."""
    cand = Path(os.path.expanduser(f"~/.pyenv/versions/{version}/bin/python3"))
    if cand.exists():
        return str(cand)
    short = ".".join(version.split(".")[:2])
    exe = shutil.which(f"python{short}")
    if exe:
        got = subprocess.run([exe, "-c", "import platform; print(platform.python_version())"],
                             capture_output=True, text=True, check=False).stdout.strip()
        if got == version:
            return exe
    raise FarmError(f"no Python {version} found (tried ~/.pyenv/versions/{version} and python{short}); "
                    f"install it (pyenv install {version})")


class StepFailed(FarmError):
    def __init__(self, message: str, log_path: Path) -> None:
        super().__init__(message)
        self.log_path = log_path


def _run_logged(cmd: list[str], logf, *, env: Mapping[str, str] | None = None, cwd: Path | None = None,
                timeout: float | None = None) -> int:
    logf.write(f"$ {' '.join(cmd)}\n")
    logf.flush()
    t0 = time.monotonic()
    try:
        rc = subprocess.run(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, cwd=cwd, timeout=timeout,
                            check=False).returncode
    except subprocess.TimeoutExpired:
        rc = 124
    logf.write(f"# rc={rc} in {time.monotonic() - t0:.1f}s\n")
    logf.flush()
    return rc


def retain_attempt(lock: Lock, step: str, log_path: Path) -> Path:
    """Copy a failed step's log into the repository, where it is kept as evidence of the attempt."""
    ATTEMPTS.mkdir(parents=True, exist_ok=True)
    dest = attempt_log(lock, step)
    shutil.copyfile(log_path, dest)
    return dest


def build_env(lock: Lock, home: Path) -> float:
    """Install the lock into its keyed directory (skipped when built); returns seconds spent."""
    target = env_dir(lock, home)
    if env_ready(lock, home):
        return 0.0
    (home / "envs").mkdir(parents=True, exist_ok=True)
    (home / "logs").mkdir(parents=True, exist_ok=True)
    log_path = home / "logs" / f"{lock.key}-build.log"
    t0 = time.monotonic()
    with open(home / "envs" / f".{lock.key}.lock", "w") as guard, log_path.open("w") as logf:
        fcntl.flock(guard, fcntl.LOCK_EX)
        if env_ready(lock, home):
            return 0.0
        if target.exists():
            shutil.rmtree(target)
        uvb = str(uv(home))
        env = {**os.environ, **BUILD_ENV, "VIRTUAL_ENV": str(target)}
        env.pop("PYTHONPATH", None)
        reqs = home / "logs" / f"{lock.key}-requirements.txt"
        reqs.write_text("\n".join(lock.requirement_lines()) + "\n")
        first = [f"{n}=={lock.packages[n]}" for n in FIRST_PHASE if n in lock.packages]
        steps = [
            [uvb, "venv", "--python", find_python(lock.python), str(target)],
            [uvb, "pip", "install", *first],
            [uvb, "pip", "sync", "--no-build-isolation", str(reqs)],
        ]
        for cmd in steps:
            if _run_logged(cmd, logf, env=env) != 0:
                raise StepFailed(f"{lock.env}: building the environment failed ({cmd[1]} {cmd[2]})", log_path)
        py = str(target / "bin" / "python")
        check = [py, "-c", "import importlib.metadata as m, json, sys; "
                 "json.dump({d.metadata['Name']: d.version for d in m.distributions()}, sys.stdout)"]
        got = subprocess.run(check, capture_output=True, text=True, env=env, check=False).stdout
        installed = {normalize(k): v for k, v in json.loads(got or "{}").items()}
        drift = {n: (v, installed.get(n)) for n, v in lock.packages.items() if installed.get(n) != v}
        drift.update({n: (None, v) for n, v in installed.items() if n not in lock.packages and n != "pip"})
        if drift:
            logf.write(f"# installed differs from the lock: {json.dumps(drift, sort_keys=True)}\n")
            raise StepFailed(f"{lock.env}: the installed environment differs from the lock ({sorted(drift)[:5]})",
                             log_path)
        (target / STAMP).write_text(lock.digest + "\n")
    attempt_log(lock, "build").unlink(missing_ok=True)  # retried and built: no longer a failure
    return time.monotonic() - t0


def generate(lock: Lock, job: FixtureJob, home: Path, fixtures: Path = FIXTURES) -> float:
    """Run the fixture generator with the environment's interpreter; returns seconds spent.

    A ``same_bytes_as`` job is generated into a scratch folder and compared with the committed
    fixture it names: equal files and ground truth keep its ``meta.json`` as the generation record
    (:func:`record_path`); anything else fails the step, with the differing files in its log."""
    log_path = home / "logs" / f"{lock.key}-{job.name}.log"
    py = str(env_dir(lock, home) / "bin" / "python")
    scratch = home / "scratch" / f"{lock.key}-{job.name}"
    cmd = [py, str(GENERATOR), "--only", job.spec, "--name", job.name,
           "--farm-lock", str((LOCKS / f"{lock.env}.toml").relative_to(ROOT)), "--farm-lock-sha256", lock.digest]
    if job.same_bytes_as is not None:
        shutil.rmtree(scratch, ignore_errors=True)
        cmd += ["--out", str(scratch)]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # A private extensions folder: a killed JIT compile leaves a lock that blocks every later run.
    env["TORCH_EXTENSIONS_DIR"] = str(home / "torch_extensions" / lock.key)
    t0 = time.monotonic()
    with log_path.open("w") as logf:
        if _run_logged(cmd, logf, env=env, cwd=ROOT) != 0:
            raise StepFailed(f"{lock.env}: producing {job.name} failed", log_path)
        if job.same_bytes_as is not None:
            keep_record(job, scratch / job.name, logf, log_path, fixtures)
            shutil.rmtree(scratch, ignore_errors=True)
    attempt_log(lock, job.name).unlink(missing_ok=True)  # retried and produced: no longer a failure
    return time.monotonic() - t0


def keep_record(job: FixtureJob, produced: Path, logf, log_path: Path, fixtures: Path = FIXTURES) -> Path:
    """Compare a ``same_bytes_as`` job's output with the committed fixture; equal: write its
    ``meta.json`` as the generation record, byte for byte as the generator wrote it."""
    raw = (produced / "meta.json").read_bytes()
    record = json.loads(raw)
    meta = _read_json(fixtures / str(job.same_bytes_as) / "meta.json") or {}
    if not same_bytes(record, meta):
        files, want = record.get("checkpoint_files") or {}, meta.get("checkpoint_files") or {}
        differ = sorted(p for p in set(files) | set(want) if files.get(p) != want.get(p))
        truth = (record.get("expected") or {}).get("sha256") == (meta.get("expected") or {}).get("sha256")
        logf.write(f"# {job.name}: not the bytes of {job.same_bytes_as}: files differ {differ}, "
                   f"ground truth {'equal' if truth else 'differs'}; commit it as its own fixture "
                   f"(remove same_bytes_as from the lock)\n")
        raise StepFailed(f"{job.name}: the output is not the bytes of {job.same_bytes_as}", log_path)
    dest = record_path(job, fixtures)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(raw)
    logf.write(f"# same bytes as {job.same_bytes_as}: generation record {dest}\n")
    return dest


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def dirty(paths: Sequence[str] = (), *, exclude: Sequence[str] = ()) -> list[str]:
    lines = git("status", "--porcelain", "--untracked-files=all", "--", *paths).splitlines()
    return [p for p in (line[3:] for line in lines)
            if not any(p == e or p.startswith(e.rstrip("/") + "/") for e in exclude)]


def ckptgate(*args: str, exe: Path | None = None, trace: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``ckptgate ARGS`` with the project's own environment, or ``exe`` (a runtime link's ckptgate);
    under strace writing ``trace`` when given."""
    exe = exe or ROOT / ".venv" / "bin" / "ckptgate"
    if not exe.exists():
        raise FarmError(f"no {exe}; run `python3 scripts/bootstrap.py setup` (or build the runtime lock) first")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    key = Path("/work/shared/keys/ci-qualification.ed25519.pem")
    if "CKPTGATE_SIGNING_KEY" not in env and not (ROOT / ".." / "shared" / "keys").is_dir() and key.is_file():
        env["CKPTGATE_SIGNING_KEY"] = str(key)
    cmd = [str(exe), *args]
    if trace is not None:
        cmd = rt.traced(cmd, trace)
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, check=False)


def matrix_rows(digest: str) -> list[str]:
    """Statuses of the matrix rows about fixture ``digest``."""
    try:
        rows = json.loads((ROOT / "matrix" / "support.json").read_text())["rows"]
    except (OSError, ValueError, KeyError):
        return []
    return [str(r.get("status")) for r in rows if r.get("fixture_digest") == digest]


def _record(home: Path, lock: Lock, fixture: str) -> Path:
    return home / "qualified" / f"{lock.key}-{fixture}.json"


def qualified_here(home: Path, lock: Lock, fixture: str) -> str | None:
    """The fixture digest of ``fixture`` when this lock qualified it and the matrix has a supported
    row for that digest (for a runtime lock: one qualified in that runtime), so the row is current
    at HEAD's candidate commit."""
    try:
        digest = json.loads(_record(home, lock, fixture).read_text())["fixture_digest"]
    except (OSError, ValueError, KeyError):
        return None
    rows = (rt.runtime_rows(ROOT / "matrix" / "support.json", digest, lock.env) if lock.kind == "runtime"
            else matrix_rows(digest))
    return digest if "supported" in rows else None


def runtime_link(lock: Lock, home: Path) -> Path:
    """This checkout's ckptgate in the built runtime environment ``lock`` (made when missing)."""
    return rt.link_runtime(env_prefix=env_dir(lock, home), link=rt.link_dir(home, lock.key, ROOT),
                           python=find_python(lock.python), root=ROOT, lock_name=lock.env, lock_sha256=lock.digest)


# ---- the run ----------------------------------------------------------------------------------


@dataclass
class Outcome:
    env: str
    generated: list[str] = field(default_factory=list)
    reused: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    rows: dict[str, list[str]] = field(default_factory=dict)
    seconds: float = 0.0
    build_seconds: float = 0.0
    disk: str = ""
    note: str = ""


def attempt_log(lock: Lock, step: str, attempts: Path = ATTEMPTS) -> Path:
    """Where a failed ``step`` (``build``, a fixture name, ``<fixture>-qualify``) of this lock keeps its log."""
    return attempts / f"{lock.key}-{step}.log"


def todo_fixtures(lock: Lock, *, retry_failed: bool, fixtures: Path = FIXTURES,
                  attempts: Path = ATTEMPTS) -> tuple[list[FixtureJob], list[FixtureJob]]:
    """(to generate, failed before at this same lock and not retried).  A fixture current at this
    lock is neither; a recorded failure is retried only when asked, so a rerun does not rewrite
    the retained log of an attempt whose inputs did not change."""
    todo, failed = [], []
    for job in lock.fixtures:
        if fixture_current(lock, job, fixtures):
            continue
        known = attempt_log(lock, job.name, attempts).exists() or attempt_log(lock, "build", attempts).exists()
        (failed if known and not retry_failed else todo).append(job)
    return todo, failed


def build_runtime(lock: Lock, home: Path, *, retry_failed: bool = False) -> Outcome:
    """A runtime lock: build its environment and link this checkout's ckptgate into it; it writes no
    fixture (its [qualify] fixtures are qualified with the others)."""
    out = Outcome(env=lock.env)
    t0 = time.monotonic()
    out.reused = [q.fixture for q in lock.qualify]
    if attempt_log(lock, "build").exists() and not retry_failed:
        out.failed, out.reused = out.reused, []
        out.note = "build failed before at this lock (--retry-failed reruns it)"
        return out
    try:
        log(f"{lock.env}: building {lock.key} ({len(lock.packages)} packages)")
        out.build_seconds = build_env(lock, home)
        runtime_link(lock, home)
        log(f"{lock.env}: runtime environment ready ({out.build_seconds:.0f}s)")
    except StepFailed as e:
        kept = retain_attempt(lock, "build", e.log_path)
        out.failed, out.reused = out.reused, []
        out.note = f"build failed: {kept.relative_to(ROOT)}"
        log(f"{lock.env}: {e}; log kept in {kept.relative_to(ROOT)}")
    except (FarmError, OSError, subprocess.SubprocessError) as e:
        out.failed, out.reused = out.reused, []
        out.note = f"not built: {e}"
        log(f"{lock.env}: {e}")
    out.seconds = time.monotonic() - t0
    return out


def build_and_generate(lock: Lock, home: Path, *, retry_failed: bool = False) -> Outcome:
    if lock.kind == "runtime":
        return build_runtime(lock, home, retry_failed=retry_failed)
    out = Outcome(env=lock.env)
    t0 = time.monotonic()
    todo, known_failed = todo_fixtures(lock, retry_failed=retry_failed)
    out.reused = [j.name for j in lock.fixtures if fixture_current(lock, j)]
    out.failed = [j.name for j in known_failed]
    if known_failed:
        out.note = f"{len(known_failed)} failed before at this lock (--retry-failed reruns them)"
    try:
        if todo:
            log(f"{lock.env}: building {lock.key} ({len(lock.packages)} packages)")
            out.build_seconds = build_env(lock, home)
            log(f"{lock.env}: environment ready ({out.build_seconds:.0f}s)")
        for job in todo:
            log(f"{lock.env}: generating {job.name} ({job.spec})")
            try:
                s = generate(lock, job, home)
                out.generated.append(job.name)
                log(f"{lock.env}: {job.name} done ({s:.0f}s)")
            except StepFailed as e:
                kept = retain_attempt(lock, job.name, e.log_path)
                out.failed.append(job.name)
                log(f"{lock.env}: {e}; log kept in {kept.relative_to(ROOT)}")
    except StepFailed as e:
        kept = retain_attempt(lock, "build", e.log_path)
        out.failed += [j.name for j in todo if j.name not in out.failed]
        out.note = f"build failed: {kept.relative_to(ROOT)}"
        log(f"{lock.env}: {e}; log kept in {kept.relative_to(ROOT)}")
    except (FarmError, OSError, subprocess.SubprocessError) as e:  # no interpreter, no uv: nothing ran
        out.failed += [j.name for j in todo if j.name not in out.failed]
        out.note = f"not built: {e}"
        log(f"{lock.env}: {e}")
    out.seconds = time.monotonic() - t0
    return out


@dataclass(frozen=True, slots=True)
class Qualification:
    """One ``ckptgate qualify`` the run makes: a producer lock's new fixture (with ckptgate's own
    environment) or a runtime lock's committed fixture (with ckptgate in that runtime)."""

    lock: Lock
    fixture: str
    adapter: str
    committed: str = ""
    """The committed fixture ``ckptgate qualify`` reads: ``fixture`` itself, or for a generation
    record (``same_bytes_as``) the fixture it wrote the bytes of."""

    @property
    def target(self) -> str:
        return self.committed or self.fixture


def qualifications(locks: Sequence[Lock], home: Path) -> list[Qualification]:
    out = [Qualification(lk, j.name, j.adapter, j.committed) for lk in locks for j in lk.fixtures
           if fixture_current(lk, j)]
    out += [Qualification(lk, q.fixture, q.adapter) for lk in locks if lk.kind == "runtime" and env_ready(lk, home)
            for q in lk.qualify]
    return out


def seccomp_facts_path(lock: Lock, facts: Path = SECCOMP_FACTS) -> Path:
    return facts / f"{lock.env}.json"


def qualify_all(locks: Sequence[Lock], outcomes: dict[str, Outcome], commit: bool, home: Path,
                *, measure_seccomp: bool = False) -> bool:
    """Qualify every produced fixture that has no supported row yet, and every runtime lock's fixtures
    that have no supported row in that runtime, then rebuild the matrix.  With ``measure_seccomp``,
    each runtime lock's qualifications run again under strace and its seccomp fact file is rewritten."""
    jobs = qualifications(locks, home)
    paths = sorted({str(FIXTURES.relative_to(ROOT) / q.target) for q in jobs if q.lock.kind == "producer"})
    paths.append(str(ATTEMPTS.relative_to(ROOT)))
    pending = dirty(paths)
    if pending:
        if not commit:
            log(f"{len(pending)} fixture file(s) are not committed; qualification needs a clean committed tree. "
                "Commit them (or rerun with --commit): the run resumes from here.")
            return False
        git("add", "--", *[p for p in paths if (ROOT / p).exists()])
        git("commit", "-q", "-m", "farm: fixtures from " + ", ".join(sorted({q.lock.env for q in jobs})))
    if dirty(exclude=EVIDENCE):
        log("the work tree has uncommitted changes; commit or stash them before qualifying")
        return False
    # Refresh the matrix first: a row is current only at this candidate commit, and the committed
    # matrix was built at an earlier one.
    r = ckptgate("matrix", "build")
    if r.returncode != 0:
        log(f"ckptgate matrix build failed:\n{r.stdout}{r.stderr}")
        return False
    changed = False
    # Failure logs are kept in the repository only once every qualification has run: a log written
    # there mid-run makes the tree dirty, and each later `ckptgate qualify` would refuse it
    # (evidence.qualify.dirty_tree) instead of qualifying its fixture.  The seccomp facts likewise.
    failures: list[tuple[Qualification, Path]] = []
    passed: list[Qualification] = []
    traces: dict[str, list[tuple[Qualification, str, Path]]] = {}
    done: dict[str, str] = {}  # committed fixture -> its qualify output, once per run (generation records share it)
    for q in jobs:
        measure = measure_seccomp and q.lock.kind == "runtime"
        if not measure and qualified_here(home, q.lock, q.fixture):
            continue
        if q.lock.kind == "producer" and q.target in done:
            _record(home, q.lock, q.fixture).parent.mkdir(parents=True, exist_ok=True)
            _record(home, q.lock, q.fixture).write_text(done[q.target])
            continue
        exe = runtime_link(q.lock, home) if q.lock.kind == "runtime" else None
        trace = home / "seccomp" / f"{q.lock.key}-{q.fixture}.strace" if measure else None
        if trace is not None:
            trace.parent.mkdir(parents=True, exist_ok=True)
        # A generation record is qualified with the fixture it wrote the bytes of: the qualification
        # names every release whose record is committed there (ckptgate.evidence.qualify).
        r = ckptgate("qualify", "--adapter", q.adapter, "--fixture", q.target, "--json", exe=exe, trace=trace)
        res = qualify_result(r.stdout)
        status = res.get("status") or f"exit {r.returncode}"
        log(f"{q.lock.env}: qualify {q.adapter} on {q.fixture}: {status}")
        if trace is not None:
            traces.setdefault(q.lock.env, []).append((q, str(status), trace))
        if res.get("fixture_digest"):
            _record(home, q.lock, q.fixture).parent.mkdir(parents=True, exist_ok=True)
            _record(home, q.lock, q.fixture).write_text(json.dumps(res, indent=2) + "\n")
            if r.returncode == 0 and q.lock.kind == "producer":
                done[q.target] = json.dumps(res, indent=2) + "\n"
        if r.returncode != 0:
            p = home / "logs" / f"{q.lock.key}-{q.fixture}-qualify.log"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(f"$ ckptgate qualify --adapter {q.adapter} --fixture {q.target}\n{r.stdout}\n{r.stderr}")
            # A runtime qualification that stored its signed failed or error result has its evidence
            # (the statement and the retained log: a refused matrix row); a copy under attempts/
            # would only move the candidate commit and make every row stale.
            if not (q.lock.kind == "runtime" and res.get("attestation")):
                failures.append((q, p))
        else:
            passed.append(q)
        changed = True
    for q, p in failures:
        kept = retain_attempt(q.lock, f"{q.fixture}-qualify", p)
        outcomes[q.lock.env].note += f" qualify {q.fixture} failed: {kept.relative_to(ROOT)}"
    for q in passed:
        attempt_log(q.lock, f"{q.fixture}-qualify").unlink(missing_ok=True)  # qualified now: no longer a failure
    for env, measured in traces.items():
        lk = measured[0][0].lock
        if not write_seccomp_facts(lk, home, [(q.fixture, q.adapter, st, t) for q, st, t in measured]):
            outcomes[env].note += " seccomp measurement failed"
    if changed or dirty():
        r = ckptgate("matrix", "build")
        if r.returncode != 0:
            log(f"ckptgate matrix build failed:\n{r.stdout}{r.stderr}")
            return False
    for q in jobs:
        try:
            digest = json.loads(_record(home, q.lock, q.fixture).read_text())["fixture_digest"]
        except (OSError, ValueError, KeyError):
            digest = None
        rows = ((rt.runtime_rows(ROOT / "matrix" / "support.json", digest, q.lock.env) if q.lock.kind == "runtime"
                 else matrix_rows(digest)) if digest else [])
        outcomes[q.lock.env].rows[q.fixture] = rows
    if commit and dirty():
        git("add", "-A", "--", *EVIDENCE, str(ATTEMPTS.relative_to(ROOT)), str(SECCOMP_FACTS.relative_to(ROOT)))
        git("commit", "-q", "-m", "farm: qualifications and matrix for " + ", ".join(lk.env for lk in locks))
    return True


def qualify_result(stdout: str) -> dict:
    """``ckptgate qualify --json``'s result: the object itself when it passed, the error's evidence
    when a signed failed or error result was stored (``evidence.qualify.failed``), else {}."""
    try:
        res = json.loads(stdout)
    except ValueError:
        return {}
    if not isinstance(res, dict):
        return {}
    err = res.get("error")
    if isinstance(err, dict) and isinstance(err.get("evidence"), dict) and "status" in err["evidence"]:
        return err["evidence"]
    return res if "status" in res else {}


def write_seccomp_facts(lock: Lock, home: Path, loads: Sequence[tuple[str, str, str, Path]]) -> bool:
    """Classify the traced worker calls of a runtime lock's qualifications into its fact file
    (scripts/seccomp_trace.py, run with the runtime's interpreter: the filter tables need pyseccomp)."""
    py = rt.link_dir(home, lock.key, ROOT) / "bin" / "python"
    cmd = [str(py), str(SECCOMP_TRACE), "--env", lock.env, "--lock-sha256", lock.digest,
           "--out", str(seccomp_facts_path(lock))]
    for fixture, adapter, status, trace in loads:
        cmd += ["--load", fixture, adapter, status, str(trace)]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    log(f"{lock.env}: seccomp: {(r.stdout + r.stderr).strip()}")
    return r.returncode == 0


def du(path: Path) -> str:
    if not path.exists():
        return "-"
    out = subprocess.run(["du", "-sh", str(path)], capture_output=True, text=True, check=False).stdout
    return out.split("\t", 1)[0] or "-"


def summary(outcomes: Sequence[Outcome]) -> str:
    head = "| environment | fixtures (new / reused / failed) | rows | time | env disk (alone) | note |"
    lines = [head, "|---|---|---|---|---|---|"]
    for o in outcomes:
        rows = sum(len(v) for v in o.rows.values())
        fx = f"{len(o.generated)} / {len(o.reused)} / {len(o.failed)}"
        lines.append(f"| {o.env} | {fx} | {rows} | {o.seconds:.0f}s | {o.disk} | {o.note.strip()} |")
    return "\n".join(lines)


def cmd_run(ns: argparse.Namespace) -> int:
    home = farm_home()
    locks = load_locks(ns.only or ())
    jobs = max(1, min(ns.jobs or (os.cpu_count() or 1), len(locks) or 1))
    t0 = time.monotonic()
    outcomes: dict[str, Outcome] = {}
    uv(home)  # once, before the environments are built in parallel
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for o in pool.map(lambda lk: build_and_generate(lk, home, retry_failed=ns.retry_failed), locks):
            outcomes[o.env] = o
    for lk in locks:
        outcomes[lk.env].disk = du(env_dir(lk, home))
    ok = all(not o.failed for o in outcomes.values())
    if not ns.no_qualify:
        ok = qualify_all(locks, outcomes, ns.commit, home, measure_seccomp=ns.measure_seccomp) and ok
    print(summary(list(outcomes.values())))
    both = subprocess.run(["du", "-shc", str(uv_cache()), str(home / "envs")], capture_output=True, text=True,
                          check=False).stdout.splitlines()
    total = both[-1].split("\t", 1)[0] if both else "-"
    print(f"total {time.monotonic() - t0:.0f}s; disk: uv cache {du(uv_cache())}, "
          f"with the environments {total} (hard links counted once)")
    return 0 if ok else 1


def uv_cache() -> Path:
    return Path(os.environ.get("UV_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "uv"))


def compile_lock(home: Path, python: str, requirements: list[str]) -> dict[str, str]:
    r = subprocess.run([str(uv(home)), "pip", "compile", "--quiet", "--no-header", "--no-annotate",
                        "--python-version", python, "--python-platform", "x86_64-unknown-linux-gnu", "-"],
                       input="\n".join(requirements) + "\n", capture_output=True, text=True, check=False)
    if r.returncode != 0:
        raise FarmError(f"uv pip compile failed for {requirements}:\n{r.stderr}")
    return parse_compiled(r.stdout)


def cmd_lock(ns: argparse.Namespace) -> int:
    path = LOCKS / f"{ns.env}.toml"
    text = path.read_text(encoding="utf-8")
    data = tomllib.loads(text)
    data.setdefault("lock", {"placeholder": "0"})
    header = "\n".join(line[2:] if line.startswith("# ") else line[1:]
                       for line in text.splitlines() if line.startswith("#"))
    home = farm_home()
    packages = compile_lock(home, data["python"], list(data["requirements"]))
    missing = [t for t in BUILD_TOOLS if t not in packages]
    if missing:
        # The sdists built without isolation (DeepSpeed) need these in the environment itself.
        packages = compile_lock(home, data["python"], [*data["requirements"], *missing])
    fixtures = tuple(FixtureJob(name=n, spec=s["spec"], adapter=s["adapter"], same_bytes_as=s.get("same_bytes_as"))
                     for n, s in data.get("fixtures", {}).items())
    qualify = tuple(QualifyJob(fixture=n, adapter=a) for n, a in data.get("qualify", {}).items())
    lock = Lock(env=ns.env, python=data["python"], requirements=tuple(data["requirements"]), fixtures=fixtures,
                packages=packages, kind=data.get("kind", "producer"), qualify=qualify)
    path.write_text(render_lock(lock, header))
    parse_lock(path)
    print(f"{path.relative_to(ROOT)}: {len(packages)} packages, digest {lock.digest[:16]}")
    return 0


def cmd_status(_: argparse.Namespace) -> int:
    home = farm_home()
    for lk in load_locks():
        built = "built" if env_ready(lk, home) else "not built"
        todo, failed = todo_fixtures(lk, retry_failed=False)
        fx = ", ".join(j.name + (" (to generate)" if j in todo else " (failed, log kept)" if j in failed else "")
                       for j in lk.fixtures)
        if lk.kind == "runtime":
            facts = "measured" if seccomp_facts_path(lk).is_file() else "not measured"
            fx = f"runtime, seccomp {facts}; qualifies " + ", ".join(q.fixture for q in lk.qualify)
        print(f"{lk.env:28} {lk.digest[:16]} {built:9} {fx}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    run = sub.add_parser("run", help="build, generate, qualify, rebuild the matrix (resumable)")
    run.add_argument("--only", action="append", metavar="ENV", help="an environment (lock name); repeatable")
    run.add_argument("--jobs", type=int, default=None, help="environments built in parallel (default: the cores)")
    run.add_argument("--commit", action="store_true", help="commit new fixtures, evidence and the matrix")
    run.add_argument("--no-qualify", action="store_true", help="stop after generating the fixtures")
    run.add_argument("--measure-seccomp", action="store_true",
                     help="runtime locks: qualify under strace and rewrite qualification/seccomp/<env>.json")
    run.add_argument("--retry-failed", action="store_true",
                     help="rerun builds and producers whose failure at the same lock is kept in qualification/attempts")
    lk = sub.add_parser("lock", help="resolve ENV's requirements into its [lock] with uv pip compile")
    lk.add_argument("env")
    sub.add_parser("status", help="which environments are built and which fixtures are current")
    ns = ap.parse_args(argv)
    try:
        return {"run": cmd_run, "lock": cmd_lock, "status": cmd_status}[ns.cmd](ns)
    except FarmError as e:
        print(f"[farm] error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
