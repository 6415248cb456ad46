"""Policy bundles: stage, sign, and name by revision.

The policy revision is a digest of every file that goes into the bundle (tests excluded), so a
receipt that names the revision names exactly the policies and policy data that decided.

Two sources are supported:

* :meth:`PolicyBundle.from_directory` stages a ``policies/`` tree as a bundle directory in the
  private work directory and signs it (``opa sign``) with a fresh ES256 key held only in memory:
  ``opa sign`` reads it from an anonymous memory file (``memfd_create``) as ``/proc/self/fd/N``,
  so the private key never has a name in any directory, not even for a moment, and a run
  killed during start-up leaves no secret behind (like any process memory, it may be swapped).
  This proves the bundle OPA loaded is the one ckptgate staged (OPA refuses a modified, added
  or missing file); it says nothing more about who wrote the policies than the file system
  does.  OPA compiles the policies once, when it loads them: ``opa build`` would compile them a
  second time on every start, which cost 0.1-0.3 s of CPU beside the digest.
* :meth:`PolicyBundle.from_signed_file` takes a bundle that a policy maintainer built and signed
  (``ckptgate policy build --signing-key ...``) together with the maintainer's public key.
  OPA verifies it at start-up and refuses to start when it was tampered with.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ckptgate import _resources  # looked up on use, so a test can stand in for where resources are
from ckptgate._resources import OPA_PINNED, OPA_SUPPORTED
from ckptgate.decide._opaproc import fd_path
from ckptgate.errors import EngineUnavailable, UsageError
from ckptgate.userfiles import check_output_file
from ckptgate.verify.dsse import KeySigner

SIGNING_ALG = "ES256"
_EXCLUDED_SUFFIXES = ("_test.rego",)
_EXCLUDED_DIRS = (".regal", "schemas")


_OPA_WAYS = (
    "Run `ckptgate engine install` (builds the pinned OPA with Go and prints the CKPTGATE_OPA=... to set); "
    "or name the binary with --opa-binary PATH, or set CKPTGATE_OPA=PATH, or put `opa` "
    f"(version {OPA_SUPPORTED}) on PATH; or use a running OPA server with --opa-url URL. "
    "OPA releases: https://github.com/open-policy-agent/opa/releases"
)
_selected_opa: Path | None = None
#: (path, inode, mtime) of each OPA binary checked -> the version its ``opa version`` reported.
_checked: dict[tuple[str, int, int], str | None] = {}


#: The time zone of every OPA process ckptgate starts that evaluates Rego (the embedded server, ``opa test``):
#: UTC, so ``"Local"`` in a time builtin (``time.clock``, ``time.date``, ``time.weekday``, ``time.format``,
#: ``time.add_date``, ``time.diff``), spelled or computed, is UTC on every machine and a decision does not
#: depend on the host's ``/etc/localtime``.  With ``TZ=UTC`` Go reads no zone file for ``Local``; and the
#: environments these processes get are built whole, so ``ZONEINFO`` (where Go looks up named zones) is
#: never passed on.
OPA_ZONE_ENV = {"TZ": "UTC"}


def select_opa_binary(path: Path | None) -> None:
    """``--opa-binary``: the OPA binary this process uses, ahead of ``$CKPTGATE_OPA`` and ``PATH``."""
    global _selected_opa  # one choice per process, made by the CLI
    _selected_opa = path


def selected_opa_binary() -> Path | None:
    """The binary ``--opa-binary`` named (:func:`select_opa_binary`), if any."""
    return _selected_opa


def find_opa() -> str:
    """The OPA binary: ``--opa-binary`` (:func:`select_opa_binary`), else ``$CKPTGATE_OPA``, else
    ``opa`` on ``PATH``, else the development clone's pinned ``.tools/bin/opa``; its version must be
    in the supported range (:data:`OPA_SUPPORTED`)."""
    if _selected_opa is not None:
        return _checked_opa(str(_selected_opa), "--opa-binary")
    explicit = os.environ.get("CKPTGATE_OPA")
    if explicit:
        return _checked_opa(explicit, "CKPTGATE_OPA")
    found = shutil.which("opa")
    if found:
        return _checked_opa(found, "PATH")
    local = _resources.clone_tool("opa")
    if local is not None:
        return _checked_opa(str(local), "the clone's .tools/bin")
    raise EngineUnavailable(
        "engine.opa.not_installed",
        "the OPA binary was not found: no --opa-binary, no CKPTGATE_OPA, and no `opa` on PATH",
        advice=_OPA_WAYS,
    )


def _checked_opa(path: str, source: str) -> str:
    """``path`` when it runs and reports a supported version (checked once per binary and process)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise EngineUnavailable(
            "engine.opa.not_installed",
            f"the OPA binary {path} (from {source}) cannot be used: {e.strerror or e}",
            evidence={"path": path, "source": source},
            advice=_OPA_WAYS,
        ) from None
    key = (path, st.st_ino, st.st_mtime_ns)
    if key in _checked:
        return path
    try:
        proc = subprocess.run(
            [path, "version"], capture_output=True, text=True, timeout=30, check=False, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise EngineUnavailable(
            "engine.opa.not_installed",
            f"the OPA binary {path} (from {source}) does not run: {e}",
            evidence={"path": path, "source": source},
            advice=_OPA_WAYS,
        ) from None
    version = parse_opa_version(proc.stdout) if proc.returncode == 0 else None
    if version is None or not opa_version_supported(version):
        shown = ".".join(map(str, version)) if version else "unknown"
        raise EngineUnavailable(
            "engine.opa.unsupported_version",
            f"the OPA binary {path} (from {source}) is version {shown}; ckptgate supports {OPA_SUPPORTED}",
            evidence={"path": path, "source": source, "version": shown, "supported": OPA_SUPPORTED},
            advice=_OPA_WAYS,
        )
    _checked[key] = reported_version(proc.stdout)
    return path


def reported_version(text: str) -> str | None:
    """The text of the ``Version:`` line of ``opa version`` output, as reported (``None`` if absent)."""
    for line in text.splitlines():
        if line.startswith("Version:"):
            return line.split(":", 1)[1].strip() or None
    return None


def opa_version() -> str | None:
    """The version the OPA binary :func:`find_opa` picks reported when it was checked (its
    ``Version:`` line), or ``None`` when no supported OPA is found.  The check runs ``opa
    version`` once per binary and process, so after the embedded engine's launch this starts no
    second process."""
    try:
        path = find_opa()
        st = os.stat(path)
    except (OSError, EngineUnavailable):
        return None
    return _checked.get((path, st.st_ino, st.st_mtime_ns))


def parse_opa_version(text: str) -> tuple[int, int, int] | None:
    """``(major, minor, patch)`` from ``opa version`` output (``Version: 1.22.3``), else ``None``."""
    m = re.search(r"^Version:\s*v?(\d+)\.(\d+)\.(\d+)", text, re.MULTILINE)
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def opa_version_supported(version: tuple[int, int, int]) -> bool:
    """The pinned release and every later release of the same major version."""
    return version[0] == OPA_PINNED[0] and version >= OPA_PINNED


#: Where extra Rego goes in the bundle: a directory the bundled policies do not use.
def policy_files(policy_dir: Path) -> list[Path]:
    """Every file that goes into the bundle, sorted: Rego (tests excluded) and JSON data."""
    out = []
    for p in sorted(policy_dir.rglob("*")):
        rel = p.relative_to(policy_dir)
        if not p.is_file() or any(part in _EXCLUDED_DIRS or part.startswith(".") for part in rel.parts):
            continue
        if (p.suffix == ".rego" and not p.name.endswith(_EXCLUDED_SUFFIXES)) or p.name == "data.json":
            out.append(p)
    return out


def _check_signing_key(path: Path) -> None:
    """The bundle signing key must be an EC P-256 private key (``ES256``); loaded as any signing key is."""
    if KeySigner.from_pem(path).algorithm != "ecdsa-p256":
        raise UsageError(
            "usage.signing_key_invalid",
            f"{path} is not an EC P-256 key; policy bundles are signed with {SIGNING_ALG}",
            advice="Create one with `openssl ecparam -name prime256v1 -genkey -noout | openssl pkcs8 -topk8 -nocrypt`.",
        )


def check_policy_dir(policy_dir: Path) -> None:
    """Refuse a policy directory that does not exist or holds no policy, before OPA is started."""
    if not os.path.isdir(policy_dir):  # False for any failure, a name too long included (Path.is_dir raises)
        raise UsageError(
            "usage.policies",
            f"the policy directory {policy_dir} "
            f"{'is not a directory' if os.path.lexists(policy_dir) else 'does not exist or cannot be used'}",
            advice="Name the policies/ directory of a ckptgate checkout with --policies (or CKPTGATE_POLICIES), "
            "or leave it out for the bundled policies.",
        )
    if not any(p.is_file() and not p.name.endswith(_EXCLUDED_SUFFIXES) for p in policy_dir.rglob("*.rego")):
        raise UsageError(
            "usage.policies",
            f"{policy_dir} holds no Rego policy (tests and schemas aside)",
            advice="Name the policies/ directory of a ckptgate checkout, or leave --policies out.",
        )


def read_policy_files(policy_dir: Path) -> dict[str, bytes]:
    """``{bundle-relative path: bytes}`` of every file :func:`policy_files` names, each read once:
    the snapshot a revision is computed over and a bundle is staged from, so the bytes OPA loads
    are the bytes the revision (and the decision's ``policy_tree`` input) names."""
    return {p.relative_to(policy_dir).as_posix(): p.read_bytes() for p in policy_files(policy_dir)}


def policy_revision(
    policy_dir: Path, overlays: dict[str, bytes] | None = None, *, files: dict[str, bytes] | None = None
) -> str:
    """sha256 over (relative path, content) of every bundled file, overlays included; ``files`` is
    a snapshot :func:`read_policy_files` took of ``policy_dir`` (read here when not given)."""
    h = hashlib.sha256()
    files = dict(read_policy_files(policy_dir) if files is None else files)
    files.update(overlays or {})
    for rel in sorted(files):
        data = files[rel]
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    return "sha256:" + h.hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyBundle:
    """A signed bundle file on disk with the public key that verifies it."""

    path: Path
    verification_key: Path
    revision: str

    @classmethod
    def from_directory(
        cls,
        policy_dir: Path,
        workdir: Path,
        *,
        overlays: dict[str, bytes] | None = None,
        files: dict[str, bytes] | None = None,
    ) -> PolicyBundle:
        """Stage ``policy_dir`` as a bundle directory inside the private ``workdir`` and sign it.

        ``overlays`` maps bundle-relative paths to replacement contents (for example a trust
        data file named on the command line); they count toward the revision.  OPA records the
        directory's absolute path in the signature, so the bundle loads only from where it was
        signed.  ``files`` is the snapshot of ``policy_dir`` (:func:`read_policy_files`) to stage,
        taken here when not given: the revision and the staged bundle are made from one read.
        """
        check_policy_dir(policy_dir)
        files = read_policy_files(policy_dir) if files is None else files
        key = ec.generate_private_key(ec.SECP256R1())
        pub_path = workdir / "bundle-verify.pem"
        pub_path.write_bytes(
            key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
        revision = policy_revision(policy_dir, overlays, files=files)
        root = (workdir / "bundle").absolute()
        _stage(files, root, overlays)
        (root / ".manifest").write_text(json.dumps({"revision": revision}))
        with _in_memory(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        ) as key_fd:
            _opa(
                "sign",
                "--signing-key",
                fd_path(key_fd),
                "--signing-alg",
                SIGNING_ALG,
                "--bundle",
                str(root),
                "-o",
                str(root),
                pass_fds=(key_fd,),
            )
        return cls(path=root, verification_key=pub_path, revision=revision)

    @classmethod
    def from_signed_file(cls, bundle: Path, verification_key: Path) -> PolicyBundle:
        """A maintainer-signed bundle; its revision is read back by OPA at decision time."""
        for p in (bundle, verification_key):
            if not p.is_file():
                raise EngineUnavailable("engine.bundle.missing", f"{p} does not exist")
        return cls(path=bundle, verification_key=verification_key, revision="")


def build_signed(
    policy_dir: Path,
    out: Path,
    *,
    signing_key: Path,
    overlays: dict[str, bytes] | None = None,
    files: dict[str, bytes] | None = None,
) -> str:
    """``opa build`` a signed bundle of ``policy_dir`` (plus overlays) into ``out``; returns its revision.
    ``files`` is the snapshot of ``policy_dir`` (:func:`read_policy_files`) to build, taken here when not
    given: the revision and the bundle are made from one read."""
    out, signing_key = out.absolute(), signing_key.absolute()  # opa build runs in the staging dir
    check_policy_dir(policy_dir)
    check_output_file(out, what="the bundle")
    _check_signing_key(signing_key)
    files = read_policy_files(policy_dir) if files is None else files
    revision = policy_revision(policy_dir, overlays, files=files)
    with tempfile.TemporaryDirectory(prefix="ckptgate-bundle-") as stage:
        root = Path(stage) / "bundle"
        _stage(files, root, overlays)
        _opa(
            "build",
            "--bundle",
            ".",
            "--revision",
            revision,
            "--signing-key",
            str(signing_key),
            "--signing-alg",
            SIGNING_ALG,
            "-o",
            str(out),
            cwd=root,
        )
    return revision


def _stage(files: dict[str, bytes], root: Path, overlays: dict[str, bytes] | None) -> None:
    """Write the snapshot ``files`` (:func:`read_policy_files`) under ``root``, then the overlays over them."""
    for rel, data in {**files, **(overlays or {})}.items():
        dst = root / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(data)


@contextlib.contextmanager
def _in_memory(secret: bytes) -> Iterator[int]:
    """``secret`` in an anonymous memory file (``memfd_create``): a descriptor with no name in any
    file system, closed on exec unless passed on explicitly, gone when the last descriptor closes
    (so with the process, however it dies).  ``opa sign`` reads it as ``/proc/self/fd/N``."""
    fd = os.memfd_create("ckptgate-bundle-signing-key", os.MFD_CLOEXEC)
    try:
        view = memoryview(secret)
        while view:
            view = view[os.write(fd, view) :]
        yield fd
    finally:
        os.close(fd)


def _opa(*args: str, cwd: Path | None = None, pass_fds: tuple[int, ...] = ()) -> None:
    """Run ``opa <args>`` to prepare a bundle; a failure is ``engine.bundle.build_failed``."""
    proc = subprocess.run([find_opa(), *args], cwd=cwd, capture_output=True, text=True, timeout=120, pass_fds=pass_fds)
    if proc.returncode != 0:
        raise EngineUnavailable(
            "engine.bundle.build_failed", f"opa {args[0]} failed: {(proc.stderr or proc.stdout).strip()[:2000]}"
        )
