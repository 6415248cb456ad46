"""Every input that shaped a decision, named by role, where it came from and its sha256.

A decision depends on more than the checkpoint and its attestations: the configuration file, the
policy-data overlay, extra Rego, the trust data and the policy tree (or a signed bundle) all change
what it says.  :class:`DecisionInput` names one of them; the engine carries the tuple into every
decision (``input.decision_inputs`` for the policies, ``Decision.inputs`` for the records), and the
embedded engine's policy revision covers it (:func:`revision_document`).

``origin`` says who could have edited the input, which is what the precedence rule is about
(docs/user-guide.md#precedence):

* ``explicit``: a command-line option or the library caller named it;
* ``environment``: an environment variable named it;
* ``discovered``: found from the current directory (the work tree a change under review can edit);
* ``base``: read from the git object store at ``--base REV`` (immutable objects, not the work tree);
* ``bundled``: installed with ckptgate (the package's policies and trust data);
* ``signed``: a signed policy bundle, verified by OPA at start-up.

A remote OPA (``--opa-url``, ``$CKPTGATE_OPA_URL``) decides with policies, data and trust that
ckptgate never reads: its input (role ``remote_engine``, origin ``explicit`` or ``environment``)
names it by its URL without credentials, path or query (``https://host:port``), with the sha256 of
that URL, and carries the ``revision`` the server reported of its bundles for that decision (null
when it reported none).  Only that role has a ``revision``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["ORIGINS", "ROLES", "DecisionInput", "revision_document", "sha256_of"]

ROLES = (
    "configuration",
    "overlay",
    "extra_rego",
    "trust",
    "policy_tree",
    "policy_bundle",
    "remote_engine",
    "hf_config",  # intake --hf-config: the declared Hugging Face config's manifest (path, size, sha256)
    "sigstore_trust_root",  # --sigstore-trust-root: the CAs and logs a Sigstore bundle is verified against
    "verification_key",  # --key: a public key an OMS bundle is verified under
    "certificate_chain",  # --certificate-chain: the CA certificates a signing certificate must chain to
)
ORIGINS = ("explicit", "environment", "discovered", "base", "bundled", "signed")


def sha256_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class DecisionInput:
    """One input that shaped a decision: its role, the path as it was named (``REV:path`` for
    ``--base``), where it came from, and the sha256 of the bytes that were used."""

    role: str
    path: str
    origin: str
    sha256: str
    #: ``remote_engine`` only: the bundle revision(s) the server reported with the decision, or None
    revision: str | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES or self.origin not in ORIGINS:
            raise ValueError(f"decision input {self.role!r} from {self.origin!r}: unknown role or origin")
        if not self.sha256.startswith("sha256:") or len(self.sha256) != 71:
            raise ValueError(f"decision input {self.path!r}: not a sha256 digest: {self.sha256!r}")
        if self.revision is not None and self.role != "remote_engine":
            raise ValueError(f"decision input {self.path!r}: only a remote engine reports a revision")

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"role": self.role, "path": self.path, "origin": self.origin, "sha256": self.sha256}
        if self.role == "remote_engine":
            doc["revision"] = self.revision
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> DecisionInput:
        """The input :meth:`to_json` wrote (a rank's decision sent to the others, a receipt read back)."""
        return cls(
            role=doc["role"],
            path=doc["path"],
            origin=doc["origin"],
            sha256=doc["sha256"],
            revision=doc.get("revision"),
        )


def revision_document(inputs: Iterable[DecisionInput]) -> dict[str, Any]:
    """What the policy revision covers of the inputs: role, origin and digest, without the paths,
    so two clones of one revision in different folders decide under the same revision."""
    return {"inputs": [{"role": i.role, "origin": i.origin, "sha256": i.sha256} for i in inputs]}
