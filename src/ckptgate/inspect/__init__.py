"""The safe plane: inspect a checkpoint by its content, never executing anything.

:func:`inspect_tree` walks the root with :class:`SafeTree` (openat2-confined), classifies every
file by magic bytes, validates safetensors headers, checks torch zips, reads pickles statically,
detects the checkpoint format and returns a frozen :class:`Inspection` whose
:meth:`Inspection.to_facts` is the ``inspection`` object of the OPA input (docs/inspect.md).
"""

from __future__ import annotations

from ckptgate.inspect.classify import FileKind
from ckptgate.inspect.files import FileFacts
from ckptgate.inspect.findings import Finding, Severity
from ckptgate.inspect.inspection import LOADERS, Inspection, inspect_open_tree, inspect_tree
from ckptgate.inspect.walk import FileEntry, SafeTree, WalkLimits
from ckptgate.inspect.zipcheck import DeferredCrcs

__all__ = [
    "LOADERS",
    "DeferredCrcs",
    "FileEntry",
    "FileFacts",
    "FileKind",
    "Finding",
    "Inspection",
    "SafeTree",
    "Severity",
    "WalkLimits",
    "inspect_open_tree",
    "inspect_tree",
]
