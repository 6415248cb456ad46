"""Binding a verified statement to the measured bytes: one subject to the fixture digest
(:func:`bind_subject`), or the subjects to every measured file (:func:`bind_manifest`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ckptgate.digest import Digest
from ckptgate.errors import VerificationError
from ckptgate.verify.statement import PREDICATE_SUBJECT_FIELDS, field_at


@dataclass(frozen=True, slots=True, kw_only=True)
class SubjectBinding:
    """The subject of a statement that was bound to the measured digest, and, for a known predicate
    type, whether each predicate field naming the attested checkpoint names that same subject."""

    name: str
    """The bound subject's name (a label: only its digest binds)."""
    digest: str
    """``sha256:<hex>`` of the bound subject (the measured digest)."""
    predicate_fields: Mapping[str, bool] = field(default_factory=dict)
    """Dotted predicate field -> whether it equals :attr:`digest`; empty for predicate types that
    ckptgate does not know (policy accepts none of those)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "predicate_fields", dict(self.predicate_fields))  # a copy the caller cannot change

    @property
    def predicate_matches(self) -> bool | None:
        """True when every such field names the bound subject; ``None`` when there are none."""
        return all(self.predicate_fields.values()) if self.predicate_fields else None


def bind_subject(statement: dict[str, Any], measured_digest: Digest) -> SubjectBinding:
    """Require a subject whose sha256 equals the measured digest, and say whether the predicate's
    fields that name the attested checkpoint (:data:`PREDICATE_SUBJECT_FIELDS`) name that subject.

    A mismatch there is not a cryptographic failure, so it is a fact for policy (``ckptgate.trust``
    refuses it), not an error here.
    """
    want = measured_digest.hex
    for s in statement["subject"]:
        got = s["digest"].get("sha256")
        if isinstance(got, str) and got.lower() == want:
            digest = measured_digest.prefixed()
            fields = {
                ".".join(path): field_at(statement.get("predicate"), *path) == digest
                for path in PREDICATE_SUBJECT_FIELDS.get(str(statement.get("predicateType")), ())
            }
            return SubjectBinding(name=str(s.get("name", "")), digest=digest, predicate_fields=fields)
    expected = ", ".join(f"sha256:{s['digest'].get('sha256')}" for s in statement["subject"][:3])
    more = f" and {len(statement['subject']) - 3} more" if len(statement["subject"]) > 3 else ""
    raise VerificationError(
        "verify.statement.subject_mismatch",
        f"no subject of the statement matches the measured fixture digest: measured {measured_digest.prefixed()}, "
        f"the statement names {expected}{more}",
        evidence={
            "measured": measured_digest.prefixed(),
            "subjects": [s["digest"].get("sha256") for s in statement["subject"]],
        },
        advice=f"The attestation was made for other bytes ({expected}{more}), not for the measured "
        f"{measured_digest.prefixed()}: do not reuse it; attest these bytes with `ckptgate attest sign`.",
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ManifestBinding:
    """How a statement's subjects cover every measured file (``binding: "manifest"``)."""

    match: str
    """``path``: subject names are the files' relative paths.  ``basename``: the subjects carry bare
    basenames (as GitHub artifact attestations write them) and every basename in the checkpoint is unique."""
    files: int
    """Measured files, each covered by a subject with the same name and sha256."""
    extra_subjects: int
    """Subjects that name no measured file (one release may attest many artifacts; policy sees the count)."""

    def to_json(self) -> dict[str, Any]:
        return {"match": self.match, "files": self.files, "extra_subjects": self.extra_subjects}


def _bind_fail(code: str, message: str, advice: str | None = None, **evidence: Any) -> VerificationError:
    return VerificationError(f"verify.statement.{code}", message, evidence=evidence, advice=advice)


def _subject_digests(statement: dict[str, Any]) -> dict[str, set[str]]:
    """Subject name -> the sha256 values it carries (lower-case); subjects without both are skipped."""
    out: dict[str, set[str]] = {}
    for s in statement["subject"]:
        name, got = s.get("name"), s.get("digest", {}).get("sha256")
        if isinstance(name, str) and name and isinstance(got, str):
            out.setdefault(name, set()).add(got.lower())
    return out


def bind_manifest(statement: dict[str, Any], manifest: Mapping[str, str]) -> ManifestBinding:
    """Bind a statement whose subjects list the checkpoint's files to ``manifest`` (relative path -> sha256
    of every measured file): every measured file must be covered by a subject with the same name and sha256.

    Names match by relative path.  When no subject name holds a ``/`` and some measured file lies in a
    folder, the subjects are bare basenames and match by basename, only if every basename in the checkpoint
    is unique.  Subjects naming no measured file are counted, not refused.  Codes
    (``verify.statement.*``): ``subject_mismatch`` (no subject names a measured file or its bytes: a
    statement about something else), ``ambiguous_basename``, ``duplicate_subject`` (one name, two digests,
    for a measured file), ``unsigned_file`` (a measured file no subject names: added after signing),
    ``renamed_file`` (its bytes are signed under another name), ``file_digest_mismatch`` (its bytes changed).
    """
    subjects = _subject_digests(statement)
    measured = {p: h.lower() for p, h in manifest.items()}
    if not measured:
        raise _bind_fail("subject_mismatch", "the checkpoint has no measured files to bind")
    by_basename = not any("/" in n for n in subjects) and any("/" in p for p in measured)
    if by_basename:
        seen: dict[str, list[str]] = {}
        for p in measured:
            seen.setdefault(p.rsplit("/", 1)[-1], []).append(p)
        clashes = {b: sorted(ps) for b, ps in seen.items() if len(ps) > 1}
        if clashes:
            raise _bind_fail(
                "ambiguous_basename",
                f"the subjects carry bare basenames, and {len(clashes)} basename(s) name several files of the "
                f"checkpoint: {sorted(clashes)[:5]}",
                files=dict(sorted(clashes.items())[:20]),
                advice="Attest the files by their relative paths inside the checkpoint.",
            )
        key = {p: p.rsplit("/", 1)[-1] for p in measured}
    else:
        key = {p: p for p in measured}
    named = {p for p in measured if key[p] in subjects}
    signed_hashes = set().union(*subjects.values()) if subjects else set()
    if not named and not any(h in signed_hashes for h in measured.values()):
        raise _bind_fail(
            "subject_mismatch",
            "no subject of the statement names a measured file or carries its sha256",
            measured_files=len(measured),
            subjects=len(statement["subject"]),
            advice="The attestation was made for different files: do not reuse it for this checkpoint.",
        )
    dup = sorted(p for p in named if len(subjects[key[p]]) > 1)
    if dup:
        raise _bind_fail(
            "duplicate_subject",
            f"{len(dup)} file(s) are named by several subjects with different digests: {dup[:5]}",
            files=dup[:20],
        )
    unnamed = sorted(set(measured) - named)
    renamed = [p for p in unnamed if measured[p] in signed_hashes]
    if renamed:
        raise _bind_fail(
            "renamed_file",
            f"{len(renamed)} file(s) carry signed bytes under a name no subject gives: {renamed[:5]}",
            files=renamed[:20],
        )
    if unnamed:
        raise _bind_fail(
            "unsigned_file",
            f"{len(unnamed)} file(s) of the checkpoint are named by no subject: {unnamed[:5]}",
            files=unnamed[:20],
            advice="A file was added after signing, or the statement does not cover the checkpoint.",
        )
    changed = sorted(p for p in named if measured[p] not in subjects[key[p]])
    if changed:
        raise _bind_fail(
            "file_digest_mismatch",
            f"{len(changed)} file(s) differ from their subject's sha256: {changed[:5]}",
            files=changed[:20],
        )
    covered = {key[p] for p in measured}
    return ManifestBinding(
        match="basename" if by_basename else "path",
        files=len(measured),
        extra_subjects=sum(1 for s in statement["subject"] if s.get("name") not in covered),
    )
