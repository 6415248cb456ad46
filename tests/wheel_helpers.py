"""The built wheel and a fresh venv for it, offline: shared by the tests that install ckptgate as a
user would (tests/test_package.py, tests/test_readme_install.py, tests/test_example_workflow.py).

The wheel is built without build isolation (hatchling, from the environment running the tests) and
installed with ``pip --no-deps --no-index``; its dependencies come from the installed environment
through a ``.pth`` link, never from an index.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

#: What the core must never need; the extras ([dtype], [torch], [qualify]) bring them.
EXTRAS_ONLY = ("torch", "numpy", "deepspeed", "megatron", "peft", "huggingface_hub", "transformers")

#: Bash functions that stand in, offline, for the index that a user's ``pip`` and ``python -m build``
#: reach.  ``python -m pip install ...`` installs local files only (``--no-index --no-deps``: the
#: dependencies are already linked); ``pip install build`` is satisfied by hatchling, the backend
#: that ``build`` would fetch; ``python -m build --wheel [--outdir D] [SRC]`` calls hatchling's
#: ``build_wheel`` as ``build`` does in its isolated environment.  Any other option is refused
#: (exit 97), so a README or workflow change that the stand-in does not model fails the test.
#: Every other ``python`` call runs unchanged.
OFFLINE_SHIMS = r"""
_CKPTGATE_BUILD_WHEEL='import os, sys, hatchling.build as b
os.makedirs(sys.argv[1], exist_ok=True)
print(b.build_wheel(sys.argv[1]))'
python() {
  if [ "$1" = -m ] && [ "$2" = pip ] && [ "$3" = install ]; then
    shift 3
    if [ "$*" = build ]; then command python -c 'import hatchling'; return; fi
    command python -m pip install --no-index --no-deps --disable-pip-version-check --no-input "$@"
  elif [ "$1" = -m ] && [ "$2" = build ]; then
    shift 2
    local outdir=dist src=.
    while [ $# -gt 0 ]; do
      case "$1" in
        --wheel) ;;
        --outdir) outdir="$2"; shift ;;
        -*) echo "offline build stand-in: unsupported option $1" >&2; return 97 ;;
        *) src="$1" ;;
      esac
      shift
    done
    outdir="$(realpath -m "$outdir")"
    (cd "$src" && command python -c "$_CKPTGATE_BUILD_WHEEL" "$outdir")
  else
    command python "$@"
  fi
}
"""


def build_wheel(out: Path) -> Path:
    """The wheel, built from this clone without downloading anything."""
    if importlib.util.find_spec("build") is not None:
        cmd = [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(REPO)]
    elif importlib.util.find_spec("hatchling") is not None:
        cmd = [sys.executable, "-c", "import sys, hatchling.build as b; b.build_wheel(sys.argv[1])", str(out)]
    else:
        pytest.skip("neither build nor hatchling is installed, and nothing may be downloaded")
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    (wheel,) = out.glob("ckptgate-*.whl")
    return wheel


def dependency_dirs() -> list[str]:
    """The installed environment's site-packages, none inside this clone (so never its src/)."""
    dirs = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()
            and not Path(p).resolve().is_relative_to(REPO)]
    if not dirs:
        pytest.skip("the dependencies are installed only inside the clone; no venv without a path back to it")
    return dirs


def copy_clone(dest: Path) -> Path:
    """A copy of the clone's tracked and unignored files under ``dest``: what a user has after ``git
    clone``, with this work tree's edits.  Copied, never hard-linked: a second link to a fixture file
    would make ckptgate's walk refuse it (``walk.hardlink``) in every later test."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        src = REPO / name
        if not src.is_file() or src.is_symlink():
            continue
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)
    return dest


def fresh_venv(env_dir: Path, *, core_only: bool = False) -> Path:
    """A new venv whose site-packages links the installed dependencies (none of them this clone;
    pip among them, so ``python -m pip`` works in it); returns its python.  With ``core_only`` the
    link is to a view of them without the extras' packages, so that the venv behaves as a core
    install: ``import torch`` fails there and ``importlib.util.find_spec("torch")`` is None."""
    venv.EnvBuilder(with_pip=False, clear=True).create(env_dir)
    py = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    dirs = [Path(d) for d in dependency_dirs()]
    if core_only:
        dirs = [core_view(d, env_dir / "core-deps" / str(i)) for i, d in enumerate(dirs)]
    (site / "_ckptgate_deps.pth").write_text("".join(f"{d}\n" for d in dirs))
    return py


def core_view(site_packages: Path, view: Path) -> Path:
    """``view``: a symbolic link to each entry of ``site_packages`` but the extras' packages and
    their metadata."""
    view.mkdir(parents=True)
    for entry in site_packages.iterdir():
        top = entry.name.split("-", 1)[0].split(".", 1)[0].lower()
        if top not in EXTRAS_ONLY and not top.startswith(tuple(f"{e}_" for e in EXTRAS_ONLY)):
            (view / entry.name).symlink_to(entry)
    return view


def user_env(env_dir: Path, home: Path) -> dict[str, str]:
    """The environment of a user whose shell has ``env_dir`` activated: no ckptgate or Python
    variables of the test run, nothing of this clone on ``PATH``, OPA named as a user names it
    (``CKPTGATE_OPA``: the one the test run uses, else the clone's pinned build)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CKPTGATE_", "PYTHON")) and k not in ("VIRTUAL_ENV",)}
    env.update(PATH=f"{env_dir / 'bin'}:/usr/local/go/bin:/usr/bin:/bin", HOME=str(home),
               VIRTUAL_ENV=str(env_dir), CKPTGATE_AUDIT_LOG=str(home / "decisions.jsonl"),
               CKPTGATE_OPA=os.environ.get("CKPTGATE_OPA") or str(REPO / ".tools" / "bin" / "opa"))
    return env
