"""``--hf-config CONFIG``: the declared Hugging Face config, read once, with its manifest.

``CONFIG`` is a ``config.json`` or a directory holding one, and optionally
``generation_config.json`` and the tokenizer files (:data:`ALLOWED`).  Every file is read once,
with a size cap, classified by content as pure data (JSON objects with no code reference, by the
same check as a checkpoint's companions [:mod:`ckptgate.inspect.coderefs`]; UTF-8 text; a
SentencePiece/tiktoken ``tokenizer.model``), and recorded in the manifest (path, size, sha256).
Exactly those bytes are published.  Any other entry of the directory is refused, and so is an
entry that is a symbolic link (its target would be published under the entry's name); the entries
are listed and opened through one descriptor of the directory.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptgate._json import JSONRejected, loads_strict
from ckptgate.consolidate.hf.args import ArgsAgreement
from ckptgate.consolidate.hf.table import Declared, declare
from ckptgate.consolidate.hf.tokens import check_token_ids
from ckptgate.errors import InputRejected, UsageError
from ckptgate.inspect.classify import FileKind
from ckptgate.inspect.coderefs import code_reference_findings
from ckptgate.inspect.roles import MAX_TOKENIZER_MODEL, companion_ok
from ckptgate.userfiles import read_regular_file

__all__ = ["ALLOWED", "ConfigFile", "HfConfig", "read_hf_config"]

_JSON_CAP = 64 << 20
#: name -> (size cap, kind). config.json is required.
ALLOWED: dict[str, tuple[int, str]] = {
    "config.json": (1 << 20, "json"),
    "generation_config.json": (1 << 20, "json"),
    "tokenizer.json": (_JSON_CAP, "json"),
    "tokenizer_config.json": (_JSON_CAP, "json"),
    "special_tokens_map.json": (1 << 20, "json"),
    "added_tokens.json": (_JSON_CAP, "json"),
    "vocab.json": (_JSON_CAP, "json"),
    "tokenizer.model": (MAX_TOKENIZER_MODEL, "model"),
    "merges.txt": (_JSON_CAP, "text"),
    "chat_template.jinja": (1 << 20, "text"),
}


class ConfigRefused(InputRejected):
    """A file of ``--hf-config`` is not pure data of an allowed name: nothing is published."""

    default_advice = (
        "--hf-config takes a config.json, or a directory of config.json, generation_config.json and "
        "tokenizer files that hold no code; remove anything else."
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfigFile:
    name: str
    size: int
    sha256: str
    data: bytes

    def to_json(self) -> dict[str, Any]:
        return {"path": self.name, "size": self.size, "sha256": self.sha256}


@dataclass(frozen=True, slots=True, kw_only=True)
class HfConfig:
    """The files read from ``--hf-config`` and the declared model of its ``config.json``."""

    source: str
    files: tuple[ConfigFile, ...]
    config: dict[str, Any]
    declared: Declared

    @property
    def manifest(self) -> list[dict[str, Any]]:
        return [f.to_json() for f in self.files]

    @property
    def digest(self) -> str:
        """sha256 of the canonical JSON manifest (sorted by path)."""
        raw = json.dumps(self.manifest, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(raw).hexdigest()

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "manifest": self.manifest, "sha256": self.digest, **self.declared.to_json()}

    def facts(
        self, layout_tp: int | None, layout_ep: int | None = None, args: ArgsAgreement | None = None
    ) -> dict[str, Any]:
        """What the policy decides on (``input.hf_mapping``): the config's facts and the TP and EP
        the layout shows; with ``args``, what the checkpoint's Megatron-LM arguments agreed and
        what stays declared, not measured."""
        out: dict[str, Any] = {
            "family": self.declared.family,
            "config_manifest": self.manifest,
            "config_sha256": "sha256:" + self.digest,
            "layout_tp": layout_tp,
            "layout_ep": layout_ep,
            "declared_not_measured": list(self.declared.not_measured),
        }
        if args is not None:
            out["megatron_args"] = args.to_json()
            out["declared_not_measured"] = list(args.not_measured)
        return out


def _read(path: Path, name: str, *, dir_fd: int | None = None) -> ConfigFile:
    """``name`` read once: the file ``path`` itself, or, with ``dir_fd``, the entry ``name`` of that
    directory, which must not be a symbolic link (read relative to the descriptor the directory was
    listed through, so an entry swapped after the listing is not followed either)."""
    cap, kind = ALLOWED[name]
    try:
        if dir_fd is None:
            raw = read_regular_file(path, limit=cap)
        else:
            raw = read_regular_file(name, limit=cap, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as e:
        if e.errno == errno.ELOOP and dir_fd is not None:
            raise ConfigRefused(
                "hf_config.symlink",
                f"{path} is a symbolic link: the file it points to would be published under its name",
                evidence={"file": name, "target": _target(dir_fd, name)},
                advice=f"Copy the files themselves into the directory (`cp -L {path} ...`, as for a Hugging Face "
                "cache snapshot), then pass that directory to --hf-config.",
            ) from None
        raise UsageError(
            "usage.hf_config.unreadable",
            f"cannot read {path}: {e.strerror}",
            advice=f"Name with --hf-config a readable config.json, or a directory holding one ({path} is not "
            "readable).",
        ) from None
    if len(raw) > cap:
        raise ConfigRefused("hf_config.too_large", f"{name} is larger than {cap} bytes", evidence={"file": name})
    ok = True
    if kind == "json":
        try:
            doc = loads_strict(raw, what=name, max_bytes=cap)
        except JSONRejected as e:
            raise ConfigRefused("hf_config.not_json", f"{name}: {e.message}", evidence={"file": name}) from None
        found = code_reference_findings(name, doc)
        if found:
            raise ConfigRefused(
                "hf_config.code_reference",
                f"{name}: {found[0].message}",
                evidence={"file": name, "codes": sorted({f.code for f in found})},
            )
        ok = isinstance(doc, dict)
    elif kind == "text":
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            ok = False
    else:
        ok = bool(companion_ok(name, FileKind.UNKNOWN, None, lambda: raw))
    if not ok:
        raise ConfigRefused(
            "hf_config.not_pure_data", f"{name} is not the pure data its name says", evidence={"file": name}
        )
    return ConfigFile(name=name, size=len(raw), sha256=hashlib.sha256(raw).hexdigest(), data=raw)


def _unreadable(path: Path, e: OSError) -> UsageError:
    """``--hf-config`` itself cannot be opened (stat or the directory's descriptor)."""
    return UsageError(
        "usage.hf_config.unreadable",
        f"cannot read --hf-config {path}: {e.strerror}",
        advice=f"Name with --hf-config a readable config.json, or a directory holding one ({path} is not readable).",
    )


def read_hf_config(path: Path) -> HfConfig:
    """Read ``--hf-config`` once: refused files raise ``hf_config.*`` (exit 4), a config outside the
    family table ``mapping.config.*``."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise _unreadable(path, e) from None
    if not stat.S_ISDIR(st.st_mode):
        files: tuple[ConfigFile, ...] = (_read(path, "config.json"),)
    else:
        try:
            dir_fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            raise _unreadable(path, e) from None
        try:
            files = _read_directory(path, dir_fd)
        finally:
            os.close(dir_fd)
    config_file = next(f for f in files if f.name == "config.json")
    config = json.loads(config_file.data)
    declared = declare(config)
    check_token_ids(files, declared.symbols["vocab_size"])
    return HfConfig(source=str(path), files=files, config=config, declared=declared)


def _target(dir_fd: int, name: str) -> str:
    try:
        return os.readlink(name, dir_fd=dir_fd)[:200]
    except OSError:
        return "?"


def _read_directory(path: Path, dir_fd: int) -> tuple[ConfigFile, ...]:
    """Every entry of the directory listed through ``dir_fd``, read through it: refused unless each is
    an allowed name, and config.json among them."""
    names = sorted(os.listdir(dir_fd))
    other = [n for n in names if n not in ALLOWED]
    if other:
        raise ConfigRefused(
            "hf_config.unlisted_file",
            f"{path} holds {other[0]!r}, which is not a config or tokenizer file",
            evidence={"files": other[:20], "allowed": sorted(ALLOWED)},
        )
    if "config.json" not in names:
        raise UsageError(
            "usage.hf_config.no_config",
            f"{path} holds no config.json",
            advice=f"Name with --hf-config the directory of the Hugging Face model whose config.json maps the "
            f"checkpoint, or that config.json itself (`ls {path}` shows what is there).",
        )
    return tuple(_read(path / n, n, dir_fd=dir_fd) for n in names)
