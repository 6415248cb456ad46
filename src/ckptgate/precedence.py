"""Which configuration and which decision inputs a command uses, and who could have edited them.

The precedence users know from other tools, and one rule of ckptgate's own:

1. Explicit options beat environment variables, which beat a discovered configuration.
   ``--trust``, ``--policies``, ``--policy-bundle`` and ``--opa-url`` make the run hermetic for what
   they name: no configuration changes it.  ``--config PATH`` names a configuration;
   ``--isolated`` (or ``CKPTGATE_NO_CONFIG=1``) uses none; ``--base REV`` reads it, and every file it
   names that shapes a decision, from git's object store at ``REV`` (:mod:`ckptgate.gitbase`).
2. **What the change under review can edit may restrict the gate, never widen it.**  A configuration
   *discovered* in the work tree may add extra Rego (which can only add deny reasons), shorten the
   freshness window or narrow gates; it may not add or change a signer, add a finding exception,
   widen a gate or replace the policy tree.  Such a widening is refused (``usage.config.widens``):
   widening comes only from explicit options, a signed bundle, or the objects at ``--base REV``.

Every file used is named, with its origin and sha256, in the decision (:mod:`ckptgate.decide.inputs`).
"""

from __future__ import annotations

import atexit
import dataclasses
import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ckptgate import workdirs
from ckptgate._resources import default_policy_dir
from ckptgate.config import Config, check_owner, discover, load_file
from ckptgate.decide.bundle import policy_revision
from ckptgate.decide.inputs import DecisionInput
from ckptgate.decide.options import EngineOptions
from ckptgate.errors import ConfigError, EngineUnavailable, UsageError
from ckptgate.gitbase import BaseConfig, materialize
from ckptgate.userfiles import read_regular_file
from ckptgate.verify.trust import MAX_TRUST_BYTES, TrustData
from ckptgate.widening import effective, widenings

__all__ = ["NO_CONFIG_ENV", "Named", "Resolved", "resolve"]

NO_CONFIG_ENV = "CKPTGATE_NO_CONFIG"
_lease: workdirs.Lease | None = None  # the work directory that holds this process's private copies (_private_dir)
_leasing = threading.Lock()
#: The largest signed policy bundle copied once (:func:`_read_once`); a larger one is read where it is.
MAX_BUNDLE_BYTES = 256 << 20  # --base files live as long as the process


@dataclass(frozen=True, slots=True, kw_only=True)
class Named:
    """What the command line and the environment named: the engine options as given, and which
    configuration to use."""

    engine: EngineOptions = field(default_factory=EngineOptions)
    config: Path | None = None
    isolated: bool = False
    base: str | None = None
    #: where discovery starts (a command's --repo), default the current directory
    start: Path | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Resolved:
    """The configuration a command uses (``None``: none), its origin, the engine options, and the base
    revision's configuration where ``--base`` was given."""

    config: Config | None
    origin: str | None
    engine: EngineOptions
    base: BaseConfig | None = None


def _quiet(_: str) -> None:
    pass


def _no_config_env() -> bool:
    return (os.environ.get(NO_CONFIG_ENV) or "").strip().lower() not in ("", "0", "false", "no")


def find(
    named: Named, *, judging: bool = False, say: Callable[[str], None] = _quiet
) -> tuple[Config | None, str | None, BaseConfig | None]:
    """The configuration ``named`` selects, its origin, and the base's configuration (``--base``)."""
    if named.isolated and (named.config is not None or named.base is not None):
        raise UsageError(
            "usage.conflicting_options",
            "--isolated uses no configuration; it cannot be combined with --config or --base",
            advice="Drop --isolated to read the configuration (from --config or --base), or drop --config/--base.",
        )
    if named.config is not None and named.base is not None and not judging:
        raise UsageError(
            "usage.conflicting_options",
            "--config names the configuration and --base reads it from git at REV: give one of them",
            advice="In pre-merge CI use --base REV alone; --config PATH names a file you trust as it is.",
        )
    base = None
    if named.base is not None:
        base = materialize(named.base, named.start or Path.cwd(), _private_dir())
        say(
            f"--base {named.base}: configuration {base.label} (commit {base.commit[:12]})"
            if base.label is not None
            else f"--base {named.base}: no configuration at commit {base.commit[:12]}; the bundled defaults apply"
        )
        if not judging:  # the work tree's configuration is not used: the base's decides
            return base.config, "base", base
    if named.isolated or (named.config is None and _no_config_env()):  # --config beats the environment
        return None, None, base
    if named.config is not None:
        path, origin = named.config, "explicit"
    else:
        found = discover(named.start)
        if found is None:
            return None, None, base
        path, origin = found, "discovered"
        say(f"using configuration {found.absolute()}")
    check_owner(path, "the configuration file")
    config = load_file(path)
    for what, p in (
        ("the trust data", config.trust),
        ("the policy-data overlay", config.policy_data.source if config.policy_data is not None else None),
        ("the extra Rego directory", config.extra_rego),
    ):
        if p is not None:
            check_owner(p, what)
    return config, origin, base


def resolve(named: Named, *, judging: bool = False, say: Callable[[str], None] = _quiet) -> Resolved:
    """The configuration and engine options for one command.  ``judging``: the command judges the
    work tree (``check``): its configuration is the change under review and is used as it is, and
    ``--base`` is read beside it for comparison and settings.  ``say`` announces on stderr which
    configuration is used and what it does not change, as soon as it is known."""
    config, origin, base = find(named, judging=judging, say=say)
    plain = named.engine
    if plain.policy_bundle is not None and plain.policy_key is not None:
        # read once: the digest the decision names, the trust data Python verifies with and the bundle
        # OPA verifies and loads are one copy, not three reads of a path another bundle can replace
        plain = dataclasses.replace(
            plain,
            policy_bundle=_read_once(plain.policy_bundle, limit=MAX_BUNDLE_BYTES, what="the policy bundle"),
            provenance={**plain.provenance, "policy_bundle": ("signed", str(plain.policy_bundle))},
        )
    if config is None or origin is None:
        return Resolved(config=config, origin=origin, engine=plain, base=base)
    if named.engine.opa_url is not None or named.engine.policy_bundle is not None:
        if config.trust or config.policy_data or config.extra_rego or config.policies:
            say(
                "the configuration's trust, overlay, extra Rego and policies are not used: "
                f"{'--opa-url' if named.engine.opa_url else '--policy-bundle'} decides with its own"
            )
        return Resolved(config=config, origin=origin, engine=plain, base=base)
    overlay, extra = config.policy_data, config.extra_rego
    if named.engine.policy_dir is not None and (config.policies or overlay or extra):
        say("--policies: the configuration's policies, overlay and extra Rego are not used")
        overlay, extra = None, None
    if named.engine.trust_file is not None and overlay is not None and overlay.signers:
        say("--trust: the overlay's signers are not added to the trust data named")
        overlay = dataclasses.replace(overlay, doc={k: v for k, v in overlay.doc.items() if k != "signers"})
    policy_dir = named.engine.policy_dir or config.policies
    # the configuration's trust data, read once: the widening check and the verifier read that copy
    trust_file = named.engine.trust_file or (config.trust and _read_once(config.trust, what="the trust data"))
    if named.engine.trust_file is None and trust_file is not None and trust_file != config.trust:
        # malformed trust data is its own typed error, named by the configured path, before the
        # widening check compares it (which reads it as JSON and would fail on a malformed shape)
        TrustData.from_json(trust_file.read_bytes(), source=str(config.trust))
    if origin == "discovered" and not judging and named.engine.policy_dir is None and config.policies is not None:
        bundled = default_policy_dir()
        if _same_tree(config.policies, bundled):  # the same bytes, from where the change cannot edit them
            policy_dir = bundled
    if origin == "discovered" and not judging:
        _refuse_widening(
            config, policy_dir, named.engine.policy_dir is not None, trust_file, named.engine.trust_file, overlay
        )
    label = base.label if origin == "base" and base is not None else str(config.source)

    def shown(p: Path) -> str:
        if origin == "base" and base is not None:
            return f"{base.rev}:{(base.directory / p.relative_to(config.root)).as_posix()}"
        return str(p)

    provenance: dict[str, tuple[str, str]] = {}
    if named.engine.trust_file is None and config.trust is not None:
        provenance["trust"] = (origin, shown(config.trust))
    if named.engine.policy_dir is None and config.policies is not None:
        provenance["policy_tree"] = (origin, shown(config.policies))
    if overlay is not None:
        provenance["overlay"] = (origin, shown(overlay.source))
    if extra is not None:
        provenance["extra_rego"] = (origin, shown(extra))
    engine = dataclasses.replace(
        plain,
        policy_dir=policy_dir,
        trust_file=trust_file,
        policy_data=overlay,
        extra_rego=extra,
        config_input=DecisionInput(role="configuration", path=label or "", origin=origin, sha256=config.sha256)
        if config.sha256
        else None,
        provenance=provenance,
    )
    return Resolved(config=config, origin=origin, engine=engine, base=base)


def _refuse_widening(
    config: Config,
    policy_dir: Path | None,
    policies_explicit: bool,
    trust_file: Path | None,
    explicit_trust: Path | None,
    overlay: object,
) -> None:
    """A discovered configuration may only restrict the bundled inputs (or an explicit ``--trust``)."""
    bundled = default_policy_dir()
    found = []
    if not policies_explicit and policy_dir is not None and not _same_tree(policy_dir, bundled):
        found.append(f"policies = {policy_dir}: replaces the bundled policy tree")
    work_tree_trust = trust_file is not None and trust_file != explicit_trust
    if not work_tree_trust and overlay is None:  # nothing read from the work tree can widen
        return _refuse(config, found)
    # compared with what the explicit options name (the bundled tree unless --policies named one)
    base = effective(policy_dir if policies_explicit and policy_dir is not None else bundled, trust_file=explicit_trust)
    new = effective(
        policy_dir or bundled,
        trust_file=trust_file,
        overlay=overlay,  # type: ignore[arg-type]
        where={"trust": str(trust_file or "trust data"), "overlay": str(getattr(overlay, "source", "overlay"))},
    )
    found += [f"{w.file}: {w.message}" for w in widenings(base, new, include_rego=False)]
    _refuse(config, found)


def _refuse(config: Config, found: list[str]) -> None:
    if found:
        raise ConfigError(
            "usage.config.widens",
            f"the configuration {config.source}, found in the work tree, widens the gate: " + "; ".join(found),
            evidence={"file": str(config.source), "widenings": found},
            advice="A configuration found from the current directory may only restrict the gate, since the "
            "change under review can edit it. Read it from a reviewed revision with --base REV (in CI: "
            "--base origin/main; locally: --base HEAD), or name it explicitly with --config PATH or --trust FILE.",
        )


def _read_once(path: Path, *, limit: int = MAX_TRUST_BYTES, what: str) -> Path:
    """A private copy of ``path`` (the configuration's trust file, a signed policy bundle), read once:
    every later reader (the widening check, the verifier, the engine) reads these bytes, not a file the
    work tree can swap between the check and the use.  A file that cannot be read whole is refused here,
    never handed on by its path (each reader would read it again)."""
    try:
        raw = read_regular_file(path, limit=limit)
    except FileNotFoundError:
        if what == "the policy bundle":  # as the engine says it (exit 6), before this copy was made
            raise EngineUnavailable("engine.bundle.missing", f"{path} does not exist") from None
        raise ConfigError(
            "usage.config.path",
            f"{what} {path} does not exist",
            evidence={"file": str(path), "what": what},
            advice=f"Name an existing file as {what} ({path} is not there).",
        ) from None
    except OSError as e:
        raise ConfigError(
            "usage.config.path",
            f"cannot read {what} {path}: {e.strerror or e}",
            evidence={"file": str(path), "what": what},
            advice=f"Name a regular file you can read as {what} ({path} is not one).",
        ) from None
    if len(raw) > limit:
        raise ConfigError(
            "usage.config.path",
            f"{what} {path} is larger than {limit} bytes",
            evidence={"file": str(path), "what": what, "limit": limit},
            advice=f"Name {what} of at most {limit} bytes ({path} is larger).",
        )
    private = _private_dir()
    copy = private / path.name
    try:
        copy.write_bytes(raw)
    except OSError as e:
        raise ConfigError(
            "usage.config.path",
            f"cannot keep a private copy of {what} {path} in {private}: {e.strerror or e}",
            evidence={"file": str(path), "what": what},
            advice=f"Free space in {private.parent} (or set XDG_RUNTIME_DIR or TMPDIR to a directory with room), "
            "then run again.",
        ) from None
    return copy


def _private_dir() -> Path:
    """A new private directory (mode 0700) that lives as long as this process, inside one work
    directory (:mod:`ckptgate.workdirs`) the process holds: what a killed run leaves there (a
    configuration's trust data, a signed bundle, ``--base``'s files) is removed by the next run's
    sweep, not left in /tmp.  One lease per process, however many copies: two descriptors, not two
    per copy; a new one where the directory has gone (a long-lived process whose runtime directory
    was cleaned at logout).  A process forked from this one (``os.fork``, multiprocessing's ``fork``
    start method: DataLoader workers, some launchers) shares the lease (:func:`_after_fork`): each keeps
    the copies it was given and makes new ones there, and the directory goes when the last of them
    exits (normally; after ``os._exit`` or a kill, at the next run's sweep)."""
    global _lease
    with _leasing:
        if _lease is None or not os.path.isdir(_lease.path):
            if _lease is not None:
                _lease.release()
            _lease = workdirs.create_work_dir()
        try:
            return Path(tempfile.mkdtemp(dir=_lease.path))  # mode 0700, beside the lease's lock file
        except OSError as e:
            raise EngineUnavailable(
                "engine.workdir.unusable",
                f"a private directory could not be made in {_lease.path}: {e.strerror or e}",
                evidence={"path": str(_lease.path)},
                advice=f"Free space in {_lease.path.parent} (or set XDG_RUNTIME_DIR to a private directory with "
                "room), then run again.",
            ) from None


def _release_at_exit() -> None:
    """At this process's exit (a forked one's too): its share of the lease; the last holder removes it."""
    if _lease is not None:
        _lease.release()


def _after_fork(*, child: bool) -> None:
    """Right after a fork, in both processes: the lease is shared from now on; the child gets a share of its
    own and a fresh lock (another thread of the parent may have held ``_leasing`` at the fork)."""
    global _leasing
    if child:
        _leasing = threading.Lock()
    if _lease is not None:
        _lease.share_after_fork(child=child)


atexit.register(_release_at_exit)
os.register_at_fork(after_in_parent=lambda: _after_fork(child=False), after_in_child=lambda: _after_fork(child=True))


def _same_tree(a: Path, b: Path) -> bool:
    return a.resolve() == b.resolve() or policy_revision(a) == policy_revision(b)
