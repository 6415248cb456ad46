"""The other producer releases that wrote a fixture's exact bytes, each vouched for by a signed
fixture-provenance statement.

Several releases often write one checkpoint byte for byte alike (torch 2.10 to 2.15 write the
same FSDP full state dict).  The farm then keeps one copy of the bytes and, for every other
environment, the ``meta.json`` it wrote as a generation record (``written_by/<name>.json``).  A
qualification of the fixture names each release whose record is vouched for by a fixture-provenance
statement about the fixture's digest, with that record as its manifest
(:mod:`ckptgate.evidence.provenance` checks the record is committed and names exactly the
measured files and ground truth).  The support policy gives each named release its own row only
when that statement is in the store, verified and trusted (``support.rego``).  A record that cannot
be vouched for names no release; why is kept in the qualification's log.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from ckptgate.digest import FixtureDigest
from ckptgate.errors import VerificationError
from ckptgate.evidence import provenance as prov
from ckptgate.evidence.errors import EvidenceError
from ckptgate.evidence.fixtures import Fixture
from ckptgate.evidence.layout import RepoLayout
from ckptgate.inspect import SafeTree
from ckptgate.verify import KeySigner, TrustData

__all__ = ["Releases", "vouched_releases"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Releases:
    """What :func:`vouched_releases` found: the releases a qualification names, the records refused."""

    named: tuple[dict[str, str], ...]
    """``{name, version, provenance, manifest}``: a release, its statement and its record (repository paths)."""
    refused: tuple[dict[str, Any], ...]
    """``{manifest, code, message}`` for each record that names no release."""

    def to_log(self) -> dict[str, Any]:
        return {"named": list(self.named), "refused": list(self.refused)}


def _version_key(release: dict[str, str]) -> tuple[str, tuple[int, ...], str]:
    parts = []
    for p in release["version"].split("+", 1)[0].split("."):
        if not p.isdigit():
            break
        parts.append(int(p))
    return release["name"], tuple(parts), release["version"]


def vouched_releases(
    layout: RepoLayout,
    fixture: Fixture,
    tree: SafeTree,
    digest: FixtureDigest,
    *,
    producer: dict[str, str],
    gate_producer: str | None,
    key: Path,
    trust: TrustData,
    commit: str,
    now: datetime,
) -> Releases:
    """For each generation record of ``fixture`` naming another release of ``producer``'s package
    than ``producer``: a stored provenance statement for it (verifying now, at ``commit``), else one
    signed with ``key`` after its checks and stored.  ``tree`` and ``digest`` are the fixture's, as
    measured by the qualification."""
    named: dict[tuple[str, str], dict[str, str]] = {}
    refused: list[dict[str, Any]] = []
    for view in fixture.written_by():
        manifest = layout.rel(view.manifest)
        try:
            release = view.producer(gate_producer)
            if release["name"] != producer["name"]:
                raise EvidenceError(
                    "evidence.release.other_producer",
                    f"{manifest} names producer {release['name']!r}, not {producer['name']!r}",
                )
            if release["version"] == producer["version"] or (release["name"], release["version"]) in named:
                continue  # the same release, written in another environment: no other row
            stored = prov.usable_provenance(
                layout, digest.digest, trust=trust, commit=commit, now=now, manifest=manifest
            )
            if stored:
                path = stored[0]
            else:
                envelope = prov.sign_provenance(
                    layout, view, tree, digest, signer=KeySigner.from_pem(key), trust=trust, commit=commit, now=now
                )
                path = prov.store_provenance(layout, envelope)
                prov.supersede_provenance(layout, path, digest.digest)
        except (EvidenceError, VerificationError) as e:
            refused.append({"manifest": manifest, "code": e.code, "message": e.message})
            continue
        named[(release["name"], release["version"])] = {
            **release,
            "provenance": layout.rel(path),
            "manifest": manifest,
        }
    return Releases(named=tuple(sorted(named.values(), key=_version_key)), refused=tuple(refused))
