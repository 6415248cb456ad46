"""What the running training job can say about itself: producer library versions (importlib.metadata),
the checkpoint's own version records, the training code's git commit, and an invocation id."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from urllib.parse import urlsplit

from ckptgate._json import loads_or_none
from ckptgate.verify.training import BaseModel, CodeRef, Producer

__all__ = [
    "PRODUCERS_BY_FORMAT",
    "checkpoint_records",
    "code_ref",
    "environment_producers",
    "invocation_id",
    "public_uri",
]

PRODUCERS_BY_FORMAT: Mapping[str, tuple[str, ...]] = {
    "hf-sharded-safetensors": ("transformers", "safetensors", "torch"),
    "safetensors": ("safetensors", "torch"),
    "peft": ("peft", "transformers", "torch"),
    "peft-lora": ("peft", "transformers", "torch"),
    "dcp-torch-save": ("torch",),
    "dcp-hf-safetensors": ("torch",),
    "fsdp-full": ("torch",),
    "fsdp-local": ("torch",),
    "megatron-torch-dist": ("megatron-core", "torch"),
    "deepspeed-zero2": ("deepspeed", "torch"),
    "deepspeed-zero3": ("deepspeed", "torch"),
    "deepspeed-universal": ("deepspeed", "torch"),
}
"""The libraries that write each format: the producer versions a statement records for it."""


def environment_producers(fmt: str) -> list[Producer]:
    """The versions of the format's producer libraries installed in the running environment."""
    out = []
    for name in PRODUCERS_BY_FORMAT.get(fmt, ()):
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
        out.append(Producer(name=name, version=version, source="environment"))
    return out


def _json_file(path: Path) -> dict[str, object]:
    """A small JSON object of the checkpoint, never through a symbolic link; ``{}`` for anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as f:
            doc = loads_or_none(f.read(1 << 20))
    except OSError:
        return {}
    return doc if isinstance(doc, dict) else {}


def checkpoint_records(root: Path, files: list[str]) -> tuple[list[Producer], BaseModel | None]:
    """Producer versions and the base model that the checkpoint's own JSON records name: transformers'
    ``config.json`` ``transformers_version``, PEFT's ``adapter_config.json`` (``peft_version`` where it
    writes one, the base model and its revision).  Read as data, never executed."""
    producers: list[Producer] = []
    base: BaseModel | None = None
    if "config.json" in files:
        v = _json_file(root / "config.json").get("transformers_version")
        if isinstance(v, str) and v:
            producers.append(Producer(name="transformers", version=v, source="checkpoint"))
    if "adapter_config.json" in files:
        cfg = _json_file(root / "adapter_config.json")
        v = cfg.get("peft_version")
        if isinstance(v, str) and v:
            producers.append(Producer(name="peft", version=v.split("@", 1)[0], source="checkpoint"))
        repo, rev = cfg.get("base_model_name_or_path"), cfg.get("revision")
        if isinstance(repo, str) and repo:
            base = BaseModel(repo=repo, revision=rev if isinstance(rev, str) and rev else "unspecified")
    return producers, base


def _git(cwd: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def public_uri(url: str) -> str:
    """``url`` without the credentials a remote may carry (``https://user:token@host/...``, a token in the
    query): the statement is signed and, keyless, logged publicly, so a secret written into it is published.
    The user name of an ``ssh://`` remote is kept (``git@host:org/repo``, scp-like, is kept whole: it carries
    no password); a URL that does not parse keeps its scheme and path only."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url  # scp-like ``git@host:org/repo`` (a user name, never a password) or a local path
    slash = rest.find("/")
    at = rest.rfind("@", 0, slash if slash >= 0 else len(rest))  # user info may hold '?' or '#', not '/'
    end = min((i for i in (rest.find(c, at + 1) for c in "/?#") if i >= 0), default=len(rest))
    userinfo, host, path = rest[: max(at, 0)], rest[at + 1 : end], rest[end:]
    user = userinfo.partition(":")[0] if at >= 0 and scheme.lower() in ("ssh", "git+ssh") else ""
    try:
        path = urlsplit(f"{scheme}://h{path}").path  # no query or fragment (a token may ride in either)
    except ValueError:
        path = path.partition("?")[0].partition("#")[0]
    return f"{scheme}://{user + '@' if user else ''}{host}{path}"


def code_ref(cwd: Path | None = None) -> CodeRef | None:
    """The training code: the git commit checked out in ``cwd`` (default: the current directory), its
    origin URL (else the work tree's path) and whether the work tree has uncommitted changes; ``None``
    outside a git work tree."""
    where = cwd or Path.cwd()
    commit = _git(where, "rev-parse", "HEAD")
    if commit is None or len(commit) != 40:
        return None
    origin = _git(where, "config", "--get", "remote.origin.url")
    uri = public_uri(origin) if origin else "git+file://" + (_git(where, "rev-parse", "--show-toplevel") or str(where))
    status = _git(where, "status", "--porcelain", "--untracked-files=no")
    return CodeRef(uri=uri, commit=commit.lower(), dirty=bool(status))


def invocation_id() -> str:
    """The scheduler's id for this run where one is set (Slurm, torchrun, GitHub Actions), else a new UUID."""
    for var, prefix in (
        ("SLURM_JOB_ID", "slurm:"),
        ("TORCHELASTIC_RUN_ID", "torchelastic:"),
        ("GITHUB_RUN_ID", "github:"),
    ):
        value = os.environ.get(var)
        if value:
            return prefix + value
    return "urn:uuid:" + str(uuid.uuid4())
