"""Permits: the only way a loader that is not pure data may run.

A :class:`Permit` is minted by :func:`issue_permit`, which only the enforce step calls
(:func:`ckptgate.enforce.gate.enforce`), once, after it checked that the decision is *allow*, that
it was made for the fixture digest of the bytes and that its ``permitted_loaders`` include the
loader.  It is bound to that fixture digest (the decision's and the bytes', one and the same), the
loader, the plane, the controls the policy required and the decision id.  A permit carries a seal (an HMAC
under a key that exists only in this process's memory), so a permit built by hand, or copied
with ``dataclasses.replace`` to another digest or loader, does not check.

A loader that is not pure data runs only in the contained worker, and only after
:func:`~ckptgate.enforce.worker.run_contained` has called :meth:`Permit.check` with the digest
of the bytes and the controls the host's preflight found.  The worker, a separate process that
never sees the seal, checks the permit's terms again against the controls actually active in it
before it reads an input (:mod:`ckptgate.enforce._worker_main`).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace

from ckptgate.decide.decision import Decision
from ckptgate.digest import Digest
from ckptgate.errors import PolicyDenied

_SEAL_KEY = secrets.token_bytes(32)


@dataclass(frozen=True, slots=True, kw_only=True)
class Permit:
    """Permission to run one loader on the exact bytes with one fixture digest."""

    fixture_digest: Digest
    loader: str
    plane: str
    required_controls: tuple[str, ...]
    decision_id: str
    policy_revision: str
    seal: str

    def _payload(self) -> bytes:
        return json.dumps(
            [
                self.fixture_digest.prefixed(),
                self.loader,
                self.plane,
                list(self.required_controls),
                self.decision_id,
                self.policy_revision,
            ]
        ).encode()

    def check(self, *, fixture_digest: Digest, loader: str, controls: Mapping[str, bool]) -> None:
        """Raise :class:`PolicyDenied` unless this permit allows ``loader`` on these bytes now."""
        want = hmac.new(_SEAL_KEY, self._payload(), hashlib.sha256).hexdigest()
        if not hmac.compare_digest(want, self.seal):
            raise PolicyDenied(
                "enforce.permit.forged", "the permit was not issued by this engine (its seal does not check)"
            )
        if fixture_digest != self.fixture_digest:
            raise PolicyDenied(
                "enforce.permit.wrong_digest",
                f"the permit is for {self.fixture_digest}, not for {fixture_digest}",
                evidence={"permit": self.fixture_digest.prefixed(), "actual": fixture_digest.prefixed()},
            )
        if loader != self.loader:
            raise PolicyDenied(
                "enforce.permit.wrong_loader", f"the permit is for loader {self.loader!r}, not {loader!r}"
            )
        missing = [c for c in self.required_controls if not controls.get(c, False)]
        if missing:
            raise PolicyDenied(
                "enforce.permit.control_missing",
                f"containment controls required by the policy are not active: {', '.join(missing)}",
                evidence={"missing": missing},
            )


def issue_permit(decision: Decision, *, fixture_digest: Digest, loader: str) -> Permit:
    """Mint a permit for ``loader`` on the bytes with ``fixture_digest``, under ``decision``.

    The enforce step checks the decision first and refuses with the typed error its refusal class
    stands for; a caller that reaches here with a deny, a decision made for another digest, or a
    loader the decision does not permit, is a programming error: :class:`ValueError`, and no permit.
    """
    if not decision.allow or decision.plane is None or loader not in decision.permitted_loaders:
        raise ValueError("a permit is minted from an allow decision only, for a loader it permits")
    if decision.fixture_digest != fixture_digest:
        raise ValueError("a permit is minted only for the fixture digest its decision was made for")
    unsealed = Permit(
        fixture_digest=fixture_digest,
        loader=loader,
        plane=decision.plane,
        required_controls=tuple(decision.required_controls),
        decision_id=decision.decision_id,
        policy_revision=decision.policy_revision,
        seal="",
    )
    return replace(unsealed, seal=hmac.new(_SEAL_KEY, unsealed._payload(), hashlib.sha256).hexdigest())
