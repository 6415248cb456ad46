"""A sha256 digest as a value (:class:`Digest`): parsed once, strictly, at the edge where a string
comes in, and written in each wire form only through its named methods.  Standard library only, so
that the worker's protocol and the first steps can carry it without the digest step's imports.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ckptgate.errors import VerificationError

__all__ = ["ALGORITHM", "Digest", "MalformedDigest"]

_HEX = re.compile(r"^[0-9a-f]{64}$")
ALGORITHM = "sha256"
_PREFIX = ALGORITHM + ":"
_STEM = ALGORITHM + "-"


class MalformedDigest(VerificationError):
    """A string that is not a sha256 digest in the form it was read in (code ``verify.digest.malformed``)."""

    default_advice = "Give the digest as sha256:<64 hex>."


def _malformed(value: object, form: str) -> MalformedDigest:
    """``form`` names the form expected; the message and evidence are those ckptgate always gave."""
    return MalformedDigest(
        "verify.digest.malformed",
        f"not a sha256 digest: {value!r}",
        evidence={"digest": value if isinstance(value, str) else repr(value)},
        advice=f"Give the digest as {form}.",
    )


@dataclass(frozen=True, slots=True)
class Digest:
    """A sha256 digest: ``algorithm`` (only ``sha256``) and ``hex`` (64 lower-case hex digits).

    Each wire form has one named writer; ``str()`` is :meth:`prefixed`.
    """

    algorithm: str
    hex: str

    def __post_init__(self) -> None:
        if self.algorithm != ALGORITHM or not isinstance(self.hex, str) or not _HEX.match(self.hex):
            raise _malformed(f"{self.algorithm}:{self.hex}", "sha256:<64 hex>")

    @classmethod
    def from_hex(cls, value: str) -> Digest:
        """Bare 64 lower-case hex (a DSSE subject's ``sha256`` value, a manifest entry)."""
        if not isinstance(value, str) or not _HEX.match(value):
            raise _malformed(value, "64 lower-case hex")
        return cls(ALGORITHM, value)

    @classmethod
    def parse(cls, value: str) -> Digest:
        """``sha256:<64 lower-case hex>`` exactly (the form ckptgate writes in JSON)."""
        if not isinstance(value, str) or not value.startswith(_PREFIX) or not _HEX.match(value[len(_PREFIX) :]):
            raise _malformed(value, "sha256:<64 hex>")
        return cls(ALGORITHM, value[len(_PREFIX) :])

    @classmethod
    def from_filename_stem(cls, value: str) -> Digest:
        """``sha256-<64 lower-case hex>`` (an attestation store directory)."""
        if not isinstance(value, str) or not value.startswith(_STEM) or not _HEX.match(value[len(_STEM) :]):
            raise _malformed(value, "sha256-<64 hex>")
        return cls(ALGORITHM, value[len(_STEM) :])

    @classmethod
    def from_user(cls, value: str) -> Digest:
        """What a person typed: surrounding space and case are forgiven, ``sha256:`` is optional."""
        if not isinstance(value, str):
            raise _malformed(value, "sha256:<64 hex>")
        d = value.strip().lower()
        d = d.removeprefix(_PREFIX)
        if not _HEX.match(d):
            raise _malformed(value, "sha256:<64 hex>")
        return cls(ALGORITHM, d)

    def prefixed(self) -> str:
        """``sha256:<hex>``: the input document, receipts, predicates."""
        return f"{self.algorithm}:{self.hex}"

    def filename_stem(self) -> str:
        """``sha256-<hex>``: a directory or file name."""
        return f"{self.algorithm}-{self.hex}"

    def dsse_subject(self) -> dict[str, str]:
        """``{"sha256": hex}``: an in-toto subject's ``digest`` object."""
        return {self.algorithm: self.hex}

    def __str__(self) -> str:
        return self.prefixed()
