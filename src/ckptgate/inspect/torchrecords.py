"""Torch zip records resolved exactly as torch's reader resolves them (:class:`_Records`).

The bytes read here are the bytes ``torch.load`` would read.  How torch does it
(``caffe2/serialize/inline_container.cc``, ``PyTorchStreamReader``, over miniz; checked against the
installed torch by ``tests/inspect/test_torchzip_differential.py``):

* The archive's prefix is the part before the first ``/`` of the *first central-directory entry*
  (``init``: an entry without ``/`` is an error).  ``getAllRecords`` then requires every name to
  start with ``prefix + "/"`` (``strncmp``: exact, case-sensitive).
* ``getRecord(name)`` / ``hasRecord(name)`` / ``getRecordOffset(name)`` call
  ``mz_zip_reader_locate_file(archive, prefix + "/" + name, NULL, 0)``.  With flags 0 miniz takes
  its sorted path: a binary search over the central directory sorted by ``mz_zip_reader_filename_less``,
  both comparing with ``MZ_TOLOWER``, i.e. **ASCII case-insensitively** (non-ASCII bytes compare
  exactly).  Among several entries that are equal under that folding it returns whichever the
  binary search meets over an unstable heap sort: neither the first nor the last in record order.
  So ``archive/data.pkl`` then ``archive/DATA.PKL`` is read as ``DATA.PKL`` (issue #16).  The
  name is a C string: the lookup stops at a NUL byte.
* The data of an entry starts at its *local* header offset + 30 + the *local* header's name and
  extra lengths (miniz's extract and ``getRecordOffset`` alike); miniz does not compare the local
  name with the central one.  :mod:`ckptgate.inspect.zipcheck` requires them to agree, and the
  sizes and CRC too, for every entry.
* What ``torch.load`` reads: in ``init``, ``.data/serialization_id`` (if present) and
  ``.data/version`` or else ``version``; in ``torch.serialization._load``, ``byteorder``,
  ``.format_version`` and ``.storage_alignment`` (each if present), ``data.pkl``, and
  ``data/<key>`` for each storage the pickle names (``get_storage_from_record``, or
  ``get_record_offset`` with ``mmap=True``).  A zip whose records include ``constants.pkl`` (exact
  name) is handed to ``torch.jit.load``.  ``persistent_load`` builds the name as ``f"data/{key}"``
  from the pickled key, whatever its type.
* Records ending ``.debug_pkl`` are hidden only when the reader's ``load_debug_symbol_`` is off; it
  is on by default, and ``torch.load`` reads them like any other (checked on torch 2.13).

Here each of those records is resolved the same way (:class:`_Records`), and refused unless the
match is unique and exact: two entries one lookup could open (``zip.name_collision`` from the zip
check, and ``torch.ambiguous_record`` here) or an entry that answers for a record only under case
folding or NUL truncation (``torch.record_name_mismatch``).  Names must all carry the first entry's
prefix (:func:`~ckptgate.inspect.torchzip.inspect_torch_zip` checks that).
"""

from __future__ import annotations

from ckptgate.inspect.findings import Finding, error
from ckptgate.inspect.zipview import ZipEntry

__all__ = ["TORCH_READS"]

#: Records ``torch.load`` reads when present, besides ``data/<key>`` (see the module docstring).
TORCH_READS = (
    "data.pkl",
    "byteorder",
    "version",
    ".data/version",
    ".data/serialization_id",
    ".format_version",
    ".storage_alignment",
)


class _Records:
    """Record name -> the zip entry torch's reader opens for it (miniz's ASCII case-insensitive
    lookup of ``prefix/name``), refusing ambiguous and inexact matches with findings."""

    def __init__(
        self, prefix: str, entries: tuple[ZipEntry, ...], base: int, path: str, findings: list[Finding]
    ) -> None:
        self.prefix, self.base, self.path, self.findings = prefix, base, path, findings
        self.folded: dict[bytes, list[ZipEntry]] = {}
        for e in entries:
            self.folded.setdefault(e.name.encode("utf-8").lower(), []).append(e)  # bytes.lower: ASCII only
        self.resolved: dict[str, ZipEntry | None] = {}

    def get(self, record: str) -> ZipEntry | None:
        if record in self.resolved:
            return self.resolved[record]
        want = f"{self.prefix}/{record}"
        # miniz compares C strings: a NUL ends the name torch looks up
        found = self.folded.get(want.encode("utf-8", "surrogatepass").split(b"\0", 1)[0].lower(), [])
        entry = None
        if len(found) > 1:
            self.findings.append(
                error(
                    "torch.ambiguous_record",
                    self.path,
                    f"record {record!r} matches "
                    f"{len(found)} entries under torch's case-insensitive lookup; which one "
                    "torch reads is miniz's choice",
                    record=record,
                    entries=[e.name for e in found][:10],
                )
            )
        elif found and found[0].name != want:
            self.findings.append(
                error(
                    "torch.record_name_mismatch",
                    self.path,
                    f"torch reads entry {found[0].name!r} for record {record!r} (its lookup "
                    "ignores ASCII case and stops at a NUL)",
                    record=record,
                    entry=found[0].name,
                )
            )
        elif found:
            entry = found[0]
        self.resolved[record] = entry
        return entry

    def ranges(self) -> dict[str, tuple[int, int]]:
        return {
            r: (self.base + e.data_offset, self.base + e.data_offset + e.size)
            for r, e in self.resolved.items()
            if e is not None
        }
