"""How to reach the policy engine, and the trust data it decides with.

:class:`EngineOptions` names the engine (embedded OPA over a policy directory, a signed bundle, or
a remote OPA); :func:`engine_for` opens it with the very trust bytes :func:`load_trust` parsed for
Python's signature checks (a ``--trust`` file, a signed bundle's own trust data, or the policy
directory's), so the engine and the verifier never read two different files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import tarfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptgate._json import loads_strict
from ckptgate._resources import default_policy_dir
from ckptgate.decide.bundle import PolicyBundle, check_policy_dir, policy_revision, read_policy_files
from ckptgate.decide.engine import PolicyEngine, open_engine, remote_engine_input
from ckptgate.decide.extra_rego import EXTRA_IN_BUNDLE, extra_rego_overlays
from ckptgate.decide.inputs import DecisionInput, revision_document, sha256_of
from ckptgate.decide.policy_tree import engine_overlays
from ckptgate.errors import UsageError
from ckptgate.verify import TrustData
from ckptgate.verify.sigstore import check_trust_root, trust_root_sha256

__all__ = ["TRUST_IN_BUNDLE", "EngineOptions", "engine_for", "load_trust", "resolved", "trust_file_in"]


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineOptions:
    """How to reach the policy engine (embedded by default)."""

    opa_url: str | None = None
    opa_token: str | None = None
    policy_dir: Path | None = None
    trust_file: Path | None = None
    timeout_s: float = 5.0
    policy_bundle: Path | None = None
    policy_key: Path | None = None
    sigstore_trust_root: Path | str | None = None  # a trusted_root.json, or "production" (sigstore's embedded root)
    #: A directory of extra Rego (the configuration's ``extra_rego``), loaded beside the policies.
    extra_rego: Path | None = None
    #: The configuration's policy-data overlay (:mod:`ckptgate.policydata`), for the embedded engine only.
    policy_data: Any = None
    #: The configuration file these options came from (``None``: none was used).
    config_input: DecisionInput | None = None
    #: Who named each input (``role -> (origin, path as named)``); a role absent here was named by
    #: the caller (``explicit``), or is the bundled default (``bundled``).
    provenance: Mapping[str, tuple[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not math.isfinite(self.timeout_s) or self.timeout_s <= 0:
            raise UsageError(
                "usage.opa_timeout",
                f"the decision timeout must be a positive number of seconds, not {self.timeout_s!r}",
                advice="Give --opa-timeout a positive number of seconds, such as --opa-timeout 10.",
            )
        if self.opa_url is not None and not self.opa_url.strip():
            # an empty URL is not "no URL": the embedded engine would decide while the decision names no input
            raise UsageError(
                "usage.opa_url",
                "--opa-url (or $CKPTGATE_OPA_URL) is empty",
                advice="Give --opa-url the remote OPA's URL, such as https://opa.example:8181, or unset "
                "CKPTGATE_OPA_URL to decide with the embedded engine.",
            )
        if self.opa_url is not None and self.policy_bundle is not None:
            raise UsageError(
                "usage.policy_bundle",
                "--policy-bundle cannot be combined with --opa-url: the remote engine decides with its own "
                "policies and trust data, not the bundle's",
                advice="Drop --opa-url (and unset CKPTGATE_OPA_URL) to decide with the signed bundle, or drop "
                "--policy-bundle/--policy-key to decide remotely.",
            )
        if self.opa_url is not None and self.trust_file is not None:
            raise UsageError(
                "usage.trust_with_remote_opa",
                "--trust cannot be combined with --opa-url: a remote policy engine decides with the trust "
                "data of its own bundle, and a client must not widen or replace central trust",
                advice="Drop --trust to use the remote engine's trust data, or drop --opa-url to "
                "decide locally with the embedded engine and this trust file.",
            )
        if self.policy_data is not None and (self.opa_url is not None or self.policy_bundle is not None):
            raise UsageError(
                "usage.policy_data_with_remote",
                "a policy-data overlay applies to the embedded engine "
                "only: a remote engine or a signed bundle decides with its own data",
                advice="Remove policy_data from ckptgate.toml (or run with CKPTGATE_NO_CONFIG=1), or drop "
                "--opa-url / --policy-bundle to decide with the embedded engine and the overlay.",
            )
        if self.policy_bundle is not None and (self.policy_key is None or self.trust_file is not None):
            # checked here, not only when the engine opens: load_trust alone (qualify verifies with
            # it) would otherwise verify with --trust while the bundle's own trust data decides
            raise UsageError(
                "usage.policy_bundle",
                "--policy-bundle needs --policy-key, and its trust data is "
                "the bundle's own (--trust cannot overlay a signed bundle)",
                advice="Pass --policy-key with the bundle's public key, and drop --trust.",
            )
        if self.policy_key is not None and self.policy_bundle is None:
            raise UsageError(
                "usage.policy_bundle",
                "--policy-key verifies a --policy-bundle; none was given",
                advice="Add --policy-bundle FILE (`ckptgate policy build` makes one), or drop --policy-key.",
            )
        if self.policy_dir is not None:
            check_policy_dir(self.policy_dir)
        if self.sigstore_trust_root is not None:
            check_trust_root(self.sigstore_trust_root)

    def in_repo(self, root: Path) -> EngineOptions:
        """These options with the repository's own ``policies/`` unless a policy directory was named."""
        return dataclasses.replace(self, policy_dir=self.policy_dir or root / "policies")


@contextlib.contextmanager
def engine_for(options: EngineOptions, trust: TrustData | None = None) -> Iterator[PolicyEngine]:
    """The policy engine ``options`` name.  With ``--trust``, the engine carries the very bytes
    ``trust`` was parsed from (read here when ``trust`` is not given), never a second read."""
    options = resolved(options)
    overlays: dict[str, bytes] = {}
    local = options.opa_url is None and options.policy_bundle is None
    files = None
    if options.policy_bundle is None:  # Python verifies signatures with it, whichever engine decides
        trust = trust or load_trust(options)
    if local:  # the policy tree, read once: the bytes its input names are the bytes staged for OPA
        tree = options.policy_dir or default_policy_dir()
        files = read_policy_files(tree)
        overlays.update(engine_overlays(tree, files))  # checked, unless it is the tree ckptgate carries
        assert trust is not None
        overlays[TRUST_IN_BUNDLE] = trust.raw  # the engine decides with the very bytes named and hashed
        if options.policy_data is not None:
            overlays.update(options.policy_data.overlays(options.policy_dir or default_policy_dir()))
        if options.extra_rego is not None:
            overlays.update(extra_rego_overlays(options.extra_rego))
    # a signed bundle's trust data is named by the bundle's digest; every other is named as the trust input
    inputs = decision_inputs(options, trust if options.policy_bundle is None else None, overlays, files)
    if local:  # the embedded engine's policy revision covers every input, the configuration included
        overlays[INPUTS_IN_BUNDLE] = json.dumps(revision_document(inputs), sort_keys=True).encode()
    bundle = None
    if options.policy_bundle is not None and options.policy_key is not None:  # both, by __post_init__
        bundle = PolicyBundle.from_signed_file(options.policy_bundle, options.policy_key)
    engine = open_engine(
        opa_url=options.opa_url,
        opa_token=options.opa_token,
        policy_dir=options.policy_dir,
        bundle=bundle,
        overlays=overlays or None,
        timeout_s=options.timeout_s,
        inputs=inputs,
        files=files,
    )
    try:
        yield engine
    finally:
        engine.close()


def resolved(options: EngineOptions) -> EngineOptions:
    """``options`` with the remote engine ``$CKPTGATE_OPA_URL`` names (and ``$CKPTGATE_OPA_TOKEN``)
    made explicit, so the engine that decides is the engine the options describe: the checks that
    refuse ``--trust`` or an overlay beside a remote engine apply, and the decision's inputs name
    no local policy tree or extra Rego that did not decide (they do name the local trust data Python
    verified signatures with: a key it lacks leaves a signature unverified, whichever engine decides).
    The engine itself reads no environment variable behind them
    (:func:`~ckptgate.decide.engine.open_engine` is given the URL)."""
    url = os.environ.get(OPA_URL_ENV)
    if options.opa_url is not None or not url:
        return options
    return dataclasses.replace(
        options,
        opa_url=url,
        opa_token=options.opa_token or os.environ.get(OPA_TOKEN_ENV),
        provenance={**options.provenance, "remote_engine": ("environment", "")},
    )


def load_trust(options: EngineOptions) -> TrustData:
    """The trust data Python verifies signatures with: the same file the policy engine carries.

    With a signed bundle, that is the bundle's own trust data (OPA refuses the bundle at start-up
    if it was tampered with, and the result is then a deny).
    """
    options = resolved(options)
    if options.policy_data is not None:  # the trust data with the overlay's signers added
        base = TrustData.from_file(options.trust_file or trust_file_in(options.policy_dir or default_policy_dir()))
        return TrustData.from_json(options.policy_data.merge_trust(base.raw), source=base.source)
    if options.trust_file is not None:
        return TrustData.from_file(options.trust_file)
    if options.policy_bundle is not None:
        return TrustData.from_json(_bundle_trust(options.policy_bundle))
    return TrustData.from_file(trust_file_in(options.policy_dir or default_policy_dir()))


def _bundle_trust(bundle: Path) -> bytes:
    """``data.ckptgate.config.trust`` of a built bundle (``opa build`` merges data into /data.json)."""
    try:
        with tarfile.open(bundle, "r:gz") as tar:
            for member in tar.getmembers():
                if member.isfile() and member.name.lstrip("/") == "data.json":
                    f = tar.extractfile(member)
                    data = loads_strict(f.read(64 << 20), what="data.json") if f is not None else {}
                    trust = data.get("ckptgate", {}).get("config", {}).get("trust")
                    if isinstance(trust, dict):
                        return json.dumps(trust).encode()
    except (OSError, tarfile.TarError, ValueError, AttributeError) as e:
        raise UsageError(
            "usage.policy_bundle",
            f"cannot read the policy bundle {bundle}: {e}",
            advice=f"Name a bundle `ckptgate policy build` wrote with --policy-bundle ({bundle} is not one).",
        ) from None
    raise UsageError(
        "usage.policy_bundle",
        f"the policy bundle {bundle} carries no ckptgate.config.trust data",
        advice=f"Build the bundle again with `ckptgate policy build` from a policy tree that has {TRUST_IN_BUNDLE}.",
    )


TRUST_IN_BUNDLE = "ckptgate/config/trust/data.json"
#: The environment variables that name a remote engine (read by :func:`resolved`, and the CLI's ``--opa-url``).
OPA_URL_ENV, OPA_TOKEN_ENV = "CKPTGATE_OPA_URL", "CKPTGATE_OPA_TOKEN"
#: The environment variable :func:`~ckptgate._resources.default_policy_dir` reads.
POLICIES_ENV = "CKPTGATE_POLICIES"
#: The manifest of decision inputs in the embedded bundle (``data.ckptgate_inputs``): the revision covers it.
INPUTS_IN_BUNDLE = "ckptgate_inputs/data.json"


def decision_inputs(
    options: EngineOptions,
    trust: TrustData | None,
    overlays: Mapping[str, bytes],
    files: dict[str, bytes] | None = None,
) -> tuple[DecisionInput, ...]:
    """Every input that shapes the decisions these options make, each with the sha256 of the very
    bytes the engine is given (``overlays``, and ``files``, the policy tree's snapshot) or Python
    verifies with (``trust``)."""

    def named(role: str, path: Path | str, default: str = "explicit") -> tuple[str, str]:
        return options.provenance.get(role, (default, str(path)))

    out: list[DecisionInput] = []
    if options.config_input is not None:
        out.append(options.config_input)
    if options.policy_bundle is not None:
        origin, path = named("policy_bundle", options.policy_bundle, "signed")
        out.append(
            DecisionInput(role="policy_bundle", path=path, origin=origin, sha256=_file_sha256(options.policy_bundle))
        )
    elif options.opa_url is None:
        tree = options.policy_dir or default_policy_dir()
        origin, path = named("policy_tree", tree, _default_origin(options.policy_dir))
        out.append(
            DecisionInput(role="policy_tree", path=path, origin=origin, sha256=policy_revision(tree, files=files))
        )
    else:  # the engine that decides, by its URL without credentials (never the URL as given)
        origin, _ = named("remote_engine", "")
        out.append(remote_engine_input(options.opa_url, origin))
    if options.policy_data is not None:
        origin, path = named("overlay", options.policy_data.source)
        out.append(DecisionInput(role="overlay", path=path, origin=origin, sha256=options.policy_data.sha256))
    if options.extra_rego is not None and options.opa_url is None and options.policy_bundle is None:
        origin, base = named("extra_rego", options.extra_rego)
        for rel, data in sorted(overlays.items()):
            if rel.startswith(EXTRA_IN_BUNDLE):
                sub = rel.removeprefix(EXTRA_IN_BUNDLE)
                out.append(
                    DecisionInput(role="extra_rego", path=f"{base}/{sub}", origin=origin, sha256=sha256_of(data))
                )
    if trust is not None:
        default = "explicit" if options.trust_file is not None else _default_origin(options.policy_dir)
        origin, path = named("trust", options.trust_file or trust.source or "", default)
        out.append(DecisionInput(role="trust", path=path, origin=origin, sha256=sha256_of(trust.raw)))
    if options.sigstore_trust_root is not None:  # Python verifies with it, whichever engine decides
        origin, path = named("sigstore_trust_root", options.sigstore_trust_root)
        out.append(
            DecisionInput(
                role="sigstore_trust_root",
                path=path,
                origin=origin,
                sha256=trust_root_sha256(options.sigstore_trust_root),
            )
        )
    return tuple(out)


def _default_origin(policy_dir: Path | None) -> str:
    """Who named the policy tree (and so its trust data) when no option did: ``$CKPTGATE_POLICIES``
    (:func:`~ckptgate._resources.default_policy_dir`) is the environment, else it is the bundled one."""
    if policy_dir is not None:
        return "explicit"
    return "environment" if os.environ.get(POLICIES_ENV) else "bundled"


def _file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def trust_file_in(policy_dir: Path) -> Path:
    return policy_dir / TRUST_IN_BUNDLE
