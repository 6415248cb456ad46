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
from typing import Any, TypeGuard

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from ckptgate import _resources  # looked up on use, so a test can stand in for where resources are
from ckptgate._resources import OPA_PINNED, OPA_SUPPORTED
from ckptgate.errors import ConfigError, EngineUnavailable, UsageError
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
EXTRA_IN_BUNDLE = "extra/"

#: The package of a consumer repository's extra Rego (``extra_rego``): it and its sub-packages,
#: ``data.ckptgate_consumer...``, are the only place it may define anything.
CONSUMER_PACKAGE = "ckptgate_consumer"
#: The one rule of it that the intake decision reads: ``data.ckptgate_consumer.deny``, a set of
#: ``{code, message}`` objects, each a deny reason ``consumer.<code>`` (``policies/ckptgate/intake/consumer.rego``).
CONSUMER_DENY = "deny"
#: Parse every file in one OPA process, with OPA's own parser (the one that loads the bundle);
#: ``--strict-builtin-errors`` makes a file that does not parse an error rather than a missing key.
_PARSE_QUERY = "{name: rego.parse_module(name, text) | some name, text in input}"
_ADVICE = (
    "Extra Rego may read data.ckptgate and input, and defines rules only in package "
    f"{CONSUMER_PACKAGE} or a sub-package of it; to refuse a checkpoint, add an element "
    f'{{"code": ..., "message": ...}} to the set data.{CONSUMER_PACKAGE}.{CONSUMER_DENY}, '
    f'e.g. `package {CONSUMER_PACKAGE}` and `deny contains {{"code": "no_fridays", '
    '"message": "..."} if ...`.'
)
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: sha256 of extra Rego sources that passed :func:`_check_sources` in this process.
_passed: set[str] = set()


def extra_rego_files(extra: Path) -> list[Path]:
    """Every ``*.rego`` file under ``extra``, tests included, sorted."""
    return sorted(p for p in extra.rglob("*.rego") if p.is_file())


def check_extra_rego(extra: Path, *, where: str = "the configuration") -> None:
    """The extra Rego directory exists and, as OPA itself parses it, defines rules only under
    ``data.ckptgate_consumer`` (:func:`extra_rego_overlays` says what else is refused).

    Without an OPA binary the parse waits for :func:`extra_rego_overlays`, which the engine and
    ``ckptgate check`` call before loading any of it, so a configuration that a command without
    the embedded engine reads needs no OPA."""
    sources = _read_extra(extra, where)
    try:
        opa = find_opa()
    except EngineUnavailable:
        return
    _check_sources(extra, sources, opa)


def extra_rego_overlays(extra: Path) -> dict[str, bytes]:
    """The extra Rego (tests excluded) as bundle overlays under ``extra/``, a directory the bundled
    policies do not use, so no bundled file is ever overwritten.

    Each file (tests included: ``ckptgate check`` runs them beside the bundled policies) is parsed
    by OPA, and the directory is refused (``usage.config.extra_rego``) unless every file's package
    is ``ckptgate_consumer`` or below it, no rule head starts with ``data``, ``input`` or an
    imported name, ``deny`` in ``ckptgate_consumer`` is neither a function nor an object, and no
    ``with`` overrides ``data`` outside ``data.ckptgate_consumer``.  So the extra Rego can read
    the bundled policies and the input but can only add deny reasons: the decision reads nothing
    of it but ``data.ckptgate_consumer.deny``.  The bytes checked are the bytes returned."""
    sources = _read_extra(extra, "the configuration")
    _check_sources(extra, sources, find_opa())
    return {f"{EXTRA_IN_BUNDLE}{rel}": data for rel, data in sources.items() if not rel.endswith("_test.rego")}


def _read_extra(extra: Path, where: str) -> dict[str, bytes]:
    if not extra.is_dir():
        raise ConfigError(
            "usage.config.path",
            f"{where}: extra_rego {extra} is not a directory",
            evidence={"file": where, "key": "extra_rego"},
        )
    out = {}
    for f in extra_rego_files(extra):
        try:
            out[f.relative_to(extra).as_posix()] = f.read_bytes()
        except OSError as e:
            raise ConfigError(
                "usage.config.extra_rego", f"cannot read {f}: {e.strerror or e}", evidence={"file": str(f)}
            ) from None
    return out


def _check_sources(extra: Path, sources: dict[str, bytes], opa: str) -> None:
    """Parse ``sources`` with OPA and refuse anything that defines outside ``data.ckptgate_consumer``."""
    digest = hashlib.sha256(json.dumps({k: v.hex() for k, v in sorted(sources.items())}).encode()).hexdigest()
    if digest in _passed or not sources:
        return
    texts = {}
    for rel, data in sources.items():
        try:
            texts[rel] = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ConfigError(
                "usage.config.extra_rego", f"cannot read {extra / rel}: {e}", evidence={"file": str(extra / rel)}
            ) from None
    modules = _parse_modules(extra, texts, opa)
    for rel in sorted(texts):
        _check_module(extra / rel, modules.get(rel))
    _passed.add(digest)


def _parse_modules(extra: Path, texts: dict[str, str], opa: str) -> dict[str, Any]:
    """``{relative path: module AST}``, parsed by OPA (``rego.parse_module``) in one process."""
    try:
        proc = subprocess.run(
            [opa, "eval", "--strict-builtin-errors", "--stdin-input", "--format", "json", _PARSE_QUERY],
            input=json.dumps(texts),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise EngineUnavailable("engine.bundle.build_failed", f"OPA could not parse the extra Rego: {e}") from None
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        doc = None
    if proc.returncode == 0 and isinstance(doc, dict):
        with contextlib.suppress(KeyError, IndexError, TypeError):
            modules = doc["result"][0]["expressions"][0]["value"]
            if isinstance(modules, dict) and set(modules) == set(texts):
                return modules
    errors = doc.get("errors") if isinstance(doc, dict) else None
    message = "; ".join(str(e.get("message", "")) for e in errors if isinstance(e, dict)) if errors else ""
    if "rego_parse_error" not in message:
        raise EngineUnavailable(
            "engine.bundle.build_failed",
            f"OPA could not parse the extra Rego in {extra}: {(message or proc.stderr or proc.stdout).strip()[:2000]}",
        )
    message = message.removeprefix("rego.parse_module: ")
    named = [rel for rel in sorted(texts) if f"{rel}:" in message]
    raise ConfigError(
        "usage.config.extra_rego",
        f"extra Rego in {extra} does not parse: {message[:2000]}",
        evidence={"file": str(extra / named[0]) if named else str(extra), "error": message[:2000]},
        advice="Extra Rego is Rego v1 (`if` before rule bodies, `contains` for sets); `opa check` names the problem.",
    )


def _refuse(file: Path, message: str, **evidence: str) -> ConfigError:
    return ConfigError(
        "usage.config.extra_rego",
        f"{file}: {message}",
        evidence={"file": str(file), **evidence},
        advice=_ADVICE,
    )


def _check_module(file: Path, module: Any) -> None:
    """Refuse a parsed module (OPA's JSON AST) that defines anything outside ``data.ckptgate_consumer``."""
    if not isinstance(module, dict) or not isinstance(module.get("package"), dict):
        raise _refuse(file, "OPA returned no module for this file")
    path = module["package"].get("path")
    package = _ref_text(path)
    if not _is_ref(path) or path[0] != {"type": "var", "value": "data"}:
        raise _refuse(file, f"the package {package} is not under data", package=package)
    if len(path) < 2 or path[1] != {"type": "string", "value": CONSUMER_PACKAGE}:
        root = path[1].get("value") if len(path) > 1 else None
        why = "the bundled policies' namespace" if root in ("ckptgate", "system") else "outside the consumer namespace"
        raise _refuse(
            file,
            f"declares package {package}, {why}: extra Rego defines rules only in package "
            f"{CONSUMER_PACKAGE} or below it, so it can add deny reasons but never change a bundled rule",
            package=package,
        )
    if len(path) > 2 and path[2] == {"type": "string", "value": CONSUMER_DENY}:
        raise _refuse(
            file,
            f"declares package {package}: data.{CONSUMER_PACKAGE}.{CONSUMER_DENY} is the set of deny "
            "reasons the decision reads, not a package",
            package=package,
        )
    imports = _imports(module.get("imports") or [])
    for rule in module.get("rules") or []:
        head = rule.get("head") if isinstance(rule, dict) else None
        ref = head.get("ref") if isinstance(head, dict) else None
        if not isinstance(head, dict) or not _is_ref(ref):
            raise _refuse(file, f"a rule in package {package} has a head OPA did not describe", package=package)
        name = _ref_text(ref)
        first = ref[0].get("value")
        if ref[0].get("type") == "var" and first in ("data", "input"):
            raise _refuse(
                file,
                f"the rule {name} starts with {first}: rule heads are relative to the package {package}",
                package=package,
                rule=name,
            )
        if ref[0].get("type") == "var" and first in imports:
            raise _refuse(
                file,
                f"the rule {name} starts with the imported name {first} ({_ref_text(imports[first])}): it would "
                f"define {package}.{name}, not the imported document; name the rule otherwise",
                package=package,
                rule=name,
            )
        if len(path) == 2 and first == CONSUMER_DENY and (len(ref) > 1 or head.get("args")):
            raise _refuse(
                file,
                f"the rule {name} is not the set data.{CONSUMER_PACKAGE}.{CONSUMER_DENY}: write it as "
                f'`{CONSUMER_DENY} contains {{"code": ..., "message": ...}} if ...`',
                package=package,
                rule=name,
            )
        for target in _with_targets(rule):
            terms = target.get("value") if target.get("type") == "ref" else [target]
            if not _is_ref(terms):
                continue
            head_var = terms[0].get("value") if terms[0].get("type") == "var" else None
            if isinstance(head_var, str) and head_var in imports:
                terms = [*imports[head_var], *terms[1:]]
            if terms[0] == {"type": "var", "value": "data"} and (
                len(terms) < 2 or terms[1] != {"type": "string", "value": CONSUMER_PACKAGE}
            ):
                overridden = _ref_text(terms)
                raise _refuse(
                    file,
                    f"the rule {name} overrides {overridden} with `with`: extra Rego may override input, "
                    f"functions and data.{CONSUMER_PACKAGE} only, so that it judges the same data.ckptgate "
                    "and data.system that decide (an override there would evaluate the bundled rules "
                    "against data that does not decide)",
                    package=package,
                    rule=name,
                    target=overridden,
                )


def _imports(imports: list[Any]) -> dict[str, list[Any]]:
    """``{name: path terms}`` for each import of ``data`` or ``input`` (by alias, else its last key)."""
    out: dict[str, list[Any]] = {}
    for imp in imports:
        term = imp.get("path") if isinstance(imp, dict) else None
        if not isinstance(term, dict):
            continue
        path = [term] if term.get("type") == "var" else term.get("value")  # `import data`, or a ref
        if not _is_ref(path) or path[0].get("value") not in ("data", "input"):
            continue
        name = imp.get("alias") or path[-1].get("value")
        if isinstance(name, str):
            out[name] = path
    return out


def _with_targets(node: Any) -> Iterator[dict[str, Any]]:
    """The target term of every ``with`` anywhere in ``node`` (bodies, else branches, comprehensions)."""
    if isinstance(node, dict):
        withs = node.get("with")
        for w in withs if isinstance(withs, list) else []:
            if isinstance(w, dict) and isinstance(w.get("target"), dict):
                yield w["target"]
        for v in node.values():
            yield from _with_targets(v)
    elif isinstance(node, list):
        for v in node:
            yield from _with_targets(v)


def _is_ref(terms: Any) -> TypeGuard[list[dict[str, Any]]]:
    return isinstance(terms, list) and bool(terms) and all(isinstance(t, dict) for t in terms)


def _ref_text(terms: Any) -> str:
    """A reference as Rego writes it: ``data.ckptgate_consumer["x y"]``, ``deny[x]``."""
    if not _is_ref(terms):
        return repr(terms)
    out = str(terms[0].get("value"))
    for t in terms[1:]:
        value = t.get("value")
        if t.get("type") == "string" and isinstance(value, str) and _IDENTIFIER.match(value):
            out += f".{value}"
        elif t.get("type") == "string":
            out += f"[{json.dumps(value)}]"
        else:
            out += f"[{value if t.get('type') == 'var' else json.dumps(value)}]"
    return out


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
    if not policy_dir.is_dir():
        raise UsageError(
            "usage.policies",
            f"the policy directory {policy_dir} {'is not a directory' if policy_dir.exists() else 'does not exist'}",
            advice="Name the policies/ directory of a ckptgate checkout with --policies (or CKPTGATE_POLICIES), "
            "or leave it out for the bundled policies.",
        )
    if not any(p.is_file() and not p.name.endswith(_EXCLUDED_SUFFIXES) for p in policy_dir.rglob("*.rego")):
        raise UsageError(
            "usage.policies",
            f"{policy_dir} holds no Rego policy (tests and schemas aside)",
            advice="Name the policies/ directory of a ckptgate checkout, or leave --policies out.",
        )


def policy_revision(policy_dir: Path, overlays: dict[str, bytes] | None = None) -> str:
    """sha256 over (relative path, content) of every bundled file, overlays included."""
    h = hashlib.sha256()
    files = {str(p.relative_to(policy_dir)): p.read_bytes() for p in policy_files(policy_dir)}
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
        cls, policy_dir: Path, workdir: Path, *, overlays: dict[str, bytes] | None = None
    ) -> PolicyBundle:
        """Stage ``policy_dir`` as a bundle directory inside the private ``workdir`` and sign it.

        ``overlays`` maps bundle-relative paths to replacement contents (for example a trust
        data file named on the command line); they count toward the revision.  OPA records the
        directory's absolute path in the signature, so the bundle loads only from where it was
        signed.
        """
        check_policy_dir(policy_dir)
        key = ec.generate_private_key(ec.SECP256R1())
        pub_path = workdir / "bundle-verify.pem"
        pub_path.write_bytes(
            key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        )
        revision = policy_revision(policy_dir, overlays)
        root = (workdir / "bundle").absolute()
        _stage(policy_dir, root, overlays)
        (root / ".manifest").write_text(json.dumps({"revision": revision}))
        with _in_memory(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        ) as key_fd:
            _opa(
                "sign",
                "--signing-key",
                f"/proc/self/fd/{key_fd}",
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
    policy_dir: Path, out: Path, *, signing_key: Path, revision: str, overlays: dict[str, bytes] | None = None
) -> None:
    """``opa build`` a signed bundle of ``policy_dir`` (plus overlays) into ``out``."""
    out, signing_key = out.absolute(), signing_key.absolute()  # opa build runs in the staging dir
    check_policy_dir(policy_dir)
    check_output_file(out, what="the bundle")
    _check_signing_key(signing_key)
    with tempfile.TemporaryDirectory(prefix="ckptgate-bundle-") as stage:
        root = Path(stage) / "bundle"
        _stage(policy_dir, root, overlays)
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


def _stage(policy_dir: Path, root: Path, overlays: dict[str, bytes] | None) -> None:
    """Copy every bundled file of ``policy_dir`` under ``root``, then the overlays over them."""
    for p in policy_files(policy_dir):
        dst = root / p.relative_to(policy_dir)
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(p, dst)
    for rel, data in (overlays or {}).items():
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
