"""Options shared by the commands that consult the policy engine."""

from __future__ import annotations

import functools
import inspect
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import click

from ckptgate._cli._base import F, UserPath, shown, stderr
from ckptgate._resources import OPA_SUPPORTED

if TYPE_CHECKING:
    from ckptgate.config import Config
    from ckptgate.decide.options import EngineOptions
    from ckptgate.evidence.layout import RepoLayout

# The imports inside functions below stay lazy: every command imports this module at start-up
# (``ckptgate --help`` included), and these measured (python -X importtime, this machine):
# ckptgate.decide.options / .bundle ~450-900 ms (the engine stack, cryptography), ckptgate.inspect.runs
# ~175 ms, ckptgate.config ~22 ms, ckptgate.evidence.* ~30 ms (the evidence machinery).

_ENGINE_KEYS = (
    "config_file",
    "isolated",
    "base",
    "opa_url",
    "opa_binary",
    "opa_timeout",
    "policy_dir",
    "trust_file",
    "policy_bundle",
    "policy_key",
    "sigstore_trust_root",
)


def _remote_engine_origin() -> dict[str, tuple[str, str]]:
    """``--opa-url`` taken from ``$CKPTGATE_OPA_URL`` (click's envvar) is named by the environment:
    the decision's ``remote_engine`` input says so, as ``resolved`` says it for a library caller."""
    ctx = click.get_current_context(silent=True)
    source = ctx.get_parameter_source("opa_url") if ctx is not None else None
    return {"remote_engine": ("environment", "")} if source is click.core.ParameterSource.ENVIRONMENT else {}


def engine_options(f: F) -> F:
    """Add the policy-engine options; the command receives them as one ``engine: EngineOptions``."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from ckptgate.decide.options import EngineOptions  # noqa: PLC0415 - engine stack, ~900 ms
        from ckptgate.precedence import Named, resolve  # noqa: PLC0415 - engine stack, ~900 ms

        values = {k: kwargs.pop(k) for k in _ENGINE_KEYS}
        if values["opa_binary"] is not None:
            from ckptgate.decide.bundle import select_opa_binary  # noqa: PLC0415 - engine stack, ~450 ms

            select_opa_binary(values["opa_binary"])
        resolved = resolve(
            Named(
                engine=EngineOptions(
                    opa_url=values["opa_url"],
                    opa_token=os.environ.get("CKPTGATE_OPA_TOKEN"),
                    policy_dir=values["policy_dir"],
                    trust_file=values["trust_file"],
                    timeout_s=values["opa_timeout"],
                    policy_bundle=values["policy_bundle"],
                    policy_key=values["policy_key"],
                    sigstore_trust_root=values["sigstore_trust_root"],
                    provenance=_remote_engine_origin(),
                ),
                config=values["config_file"],
                isolated=values["isolated"],
                base=values["base"],
                start=kwargs.get("repo"),  # a command's --repo names the repository configured
            ),
            # commands that work on a repository (check, qualify, matrix, provenance) judge its work
            # tree: its configuration is the change under review, compared with --base
            judging="repo" in kwargs,
            say=lambda note: stderr.print(f"[dim]ckptgate:[/] {shown(note)}"),
        )
        kwargs["engine"] = resolved.engine
        if "resolved" in inspect.signature(f).parameters:
            kwargs["resolved"] = resolved
        return f(*args, **kwargs)

    w: Callable[..., Any] = wrapper
    w = click.option(
        "--base",
        "base",
        default=None,
        metavar="REV",
        help="Read the configuration, and the trust data, overlay, extra Rego and policies it names, from "
        "git's object store at REV (pre-merge CI: the target branch), not from the work tree.",
    )(w)
    w = click.option(
        "--isolated",
        is_flag=True,
        default=False,
        help="Use no configuration file (also CKPTGATE_NO_CONFIG=1).",
    )(w)
    w = click.option(
        "--config",
        "config_file",
        type=UserPath(dir_okay=False, exists=True, path_type=Path),
        default=None,
        help="The configuration file to use, instead of the one discovered from the current directory.",
    )(w)
    w = click.option(
        "--opa-url",
        envvar="CKPTGATE_OPA_URL",
        default=None,
        help="Use the OPA server at this URL instead of the embedded one (token from CKPTGATE_OPA_TOKEN).",
    )(w)
    w = click.option(
        "--opa-binary",
        type=UserPath(dir_okay=False, path_type=Path),
        default=None,
        help="The OPA binary for the embedded engine (default: $CKPTGATE_OPA, else `opa` on PATH); "
        f"supported: OPA {OPA_SUPPORTED}.",
    )(w)
    w = click.option(
        "--opa-timeout",
        type=click.FloatRange(0.01, 600),
        default=5.0,
        show_default=True,
        help="Seconds to wait for a decision; a late decision is deny.",
    )(w)
    w = click.option(
        "--policies",
        "policy_dir",
        type=UserPath(file_okay=False, path_type=Path),
        default=None,
        help="Policy directory for the embedded OPA (default: the bundled policies/).",
    )(w)
    w = click.option(
        "--policy-bundle",
        type=UserPath(dir_okay=False, exists=True, path_type=Path),
        default=None,
        help="A signed bundle from `ckptgate policy build` (needs --policy-key).",
    )(w)
    w = click.option(
        "--policy-key",
        type=UserPath(dir_okay=False, exists=True, path_type=Path),
        default=None,
        help="PEM public key that verifies --policy-bundle; OPA refuses a tampered bundle.",
    )(w)
    w = click.option(
        "--sigstore-trust-root",
        type=TrustRoot(),
        default=None,
        help="trusted_root.json for verifying Sigstore bundles offline, or 'production' for the root "
        "embedded in sigstore-python; the identities come from the trust data's sigstore "
        "signers.",
    )(w)
    w = click.option(
        "--trust",
        "trust_file",
        type=UserPath(dir_okay=False, path_type=Path),
        default=None,
        help="Trust data file (default: the configuration's trust, else policies/ckptgate/config/trust/data.json).",
    )(w)
    return cast("F", w)


def checkpoint_option(arg: str) -> Callable[[F], F]:
    """``--checkpoint N|latest``: which ``checkpoint-N/`` of a ``Trainer`` output directory the
    command works on.  The path argument ``arg`` is replaced by the selected folder before the
    command runs, so the digest, the inspection and the receipt cover that folder only."""

    def deco(f: F) -> F:
        @functools.wraps(f)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            from ckptgate.inspect.runs import select_checkpoint  # noqa: PLC0415 - ~175 ms

            kwargs[arg] = select_checkpoint(kwargs[arg], kwargs.pop("checkpoint"))
            return f(*args, **kwargs)

        return cast(
            "F",
            click.option(
                "--checkpoint",
                "checkpoint",
                default=None,
                metavar="N|latest",
                help="In a run directory holding Trainer checkpoint-N or Megatron-LM iter_NNNNNNN folders, work "
                "on step N ('latest': the highest N, or the iteration Megatron-LM's "
                "latest_checkpointed_iteration.txt names); required when it holds several.",
            )(wrapper),
        )

    return deco


def load_config(start: Path | None = None, *, announce: bool = True) -> Config | None:
    """The repository configuration found from ``start`` (default: the current directory), else
    ``None``; refused when another user owns it or can write it (``CKPTGATE_NO_CONFIG=1``: none)."""
    from ckptgate.config import check_owner, discover, load_file  # noqa: PLC0415 - ~22 ms
    from ckptgate.precedence import NO_CONFIG_ENV  # noqa: PLC0415 - engine stack

    if (os.environ.get(NO_CONFIG_ENV) or "").strip().lower() not in ("", "0", "false", "no"):
        return None
    path = discover(start)
    if path is None:
        return None
    check_owner(path, "the configuration file")
    if announce:
        stderr.print(f"[dim]ckptgate:[/] using configuration {shown(path.absolute())}")
    return load_file(path)


def evidence_repo(repo: Path | None, engine: EngineOptions) -> tuple[RepoLayout, EngineOptions]:
    """The :class:`~ckptgate.evidence.layout.RepoLayout` of the repository ``--repo`` names (default:
    the git work tree of the cwd), from its configuration, and the engine options to use there:
    ``engine`` as the configuration set it, else with the repository's own ``policies/``."""
    from ckptgate.evidence.candidate import repo_root  # noqa: PLC0415 - the evidence machinery
    from ckptgate.evidence.layout import RepoLayout  # noqa: PLC0415 - the evidence machinery

    root = repo_root(repo)
    config = load_config(root if repo is not None else None, announce=False)  # the command announced it
    return RepoLayout.from_config(root, config), engine if config is not None else engine.in_repo(root)


def signature_options(f: F) -> F:
    """``--signature FILE`` (repeatable), ``--key PUB.pem`` and ``--certificate-chain CA.pem`` (repeatable):
    OpenSSF Model Signing bundles and what verifies them; the command receives ``signatures``, ``key``
    and ``certificate_chains``."""
    f = click.option(
        "--signature",
        "signatures",
        multiple=True,
        type=UserPath(dir_okay=False, path_type=Path),
        help="An OpenSSF Model Signing bundle (model_signing key or certificate method) about the "
        "checkpoint (repeatable; needs --key or --certificate-chain).",
    )(f)
    f = click.option(
        "--certificate-chain",
        "certificate_chains",
        multiple=True,
        type=UserPath(dir_okay=False, path_type=Path),
        help="PEM CA certificates that a certificate-method --signature, or an --attestation signed under an "
        "X.509 certificate, must chain to (repeatable); which signer identity is trusted comes from the trust "
        "data's certificate signers.",
    )(f)
    f = click.option(
        "--key",
        "key",
        type=UserPath(dir_okay=False, path_type=Path),
        default=None,
        help="PEM public key (ECDSA P-256 or P-384, or Ed25519) that verifies --signature; trusted by "
        "policy for Model Signing statements only, never added to the trust data.",
    )(f)
    return f


def qualification_key_option(f: F) -> F:
    """``--key PEM``: the key that signs a qualification or fixture-provenance statement."""
    return click.option(
        "--key",
        "key",
        type=UserPath(dir_okay=False, path_type=Path),
        default=None,
        help="PEM private key (default: $CKPTGATE_SIGNING_KEY, else ../shared/keys/ci-qualification).",
    )(f)


def repo_option(f: F) -> F:
    """``--repo DIR``: the repository the evidence commands work on."""
    return click.option(
        "--repo",
        type=UserPath(file_okay=False, path_type=Path),
        default=None,
        help="Repository root (default: the git work tree of the current directory).",
    )(f)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}


class ByteSize(click.ParamType[int, Any]):
    """A size in bytes: a plain integer, or a number with the units ``huggingface_hub`` accepts
    (``5GB``, ``500MB``: powers of 1000) or IEC units (``2GiB``: powers of 1024)."""

    name = "size"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            n = value
        else:
            m = _SIZE.match(str(value))
            if m is None:
                self.fail(
                    f"{value!r} is not a size: use bytes (2147483648), or units such as 5GB, 500MB or 2GiB", param, ctx
                )
            n = int(float(m.group(1)) * _UNITS[(m.group(2) or "").upper()])
        if n < 1:
            self.fail(f"{value!r} is less than one byte", param, ctx)
        return n


class TrustRoot(click.ParamType[Path | str, Any]):
    """``--sigstore-trust-root``: an existing file, or the word ``production`` (the Sigstore
    production root embedded in sigstore-python, used offline), as ``attest verify`` takes it."""

    name = "file|production"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Path | str:
        if value == "production":
            return "production"
        return cast(Path, UserPath(dir_okay=False, exists=True, path_type=Path).convert(value, param, ctx))


def quiet_option(f: F) -> F:
    """``--quiet``: no progress bars on stderr (they are drawn only on a terminal anyway)."""
    return click.option(
        "--quiet",
        "-q",
        is_flag=True,
        default=False,
        help="Draw no progress bars; results and errors are still printed.",
    )(f)
