"""A repository's ckptgate configuration: ``ckptgate.toml``, or ``[tool.ckptgate]`` in ``pyproject.toml``.

Found by walking up from the current directory to the top of its git work tree, as git finds its
own: in each directory ``ckptgate.toml`` first, then a ``pyproject.toml`` with a ``[tool.ckptgate]``
table.  Outside a git work tree the walk stops at the user's home directory or at a file-system
boundary, never climbing to ``/``.  A configuration file, and every file it names that shapes a
decision (trust data, overlay, extra Rego), must be owned by the invoking user or root and not be
writable by group or others (git's ``safe.directory`` rule; ``CKPTGATE_SAFE_OWNERS`` names other
owners): see :func:`check_owner`.  Paths in it are relative to the directory of the file that holds it and
must stay inside that directory.  The table is validated against a JSON schema (unknown keys are
refused, so a typo is an error rather than a silently ignored setting); every problem is a
:class:`ConfigError` with a ``usage.config.*`` code.

Keys (all optional)::

    trust = "trust.json"               # trust data, as --trust (an explicit --trust wins)
    extra_rego = "policy"              # extra Rego, loaded beside the bundled policies
    policy_data = "ckptgate-data.json" # policy-data overlay: signers, gates, finding exceptions, freshness
    docs = ["README.md", "docs/**/*.md"]   # what the claims lint reads
    attestations = "attestations"      # the attestation store
    matrix = "matrix"                  # the support matrix; set only where adapters are qualified
    fixtures = "tests/fixtures/data"   # fixtures for qualifying adapters
    policies = "policies"              # ckptgate's own repository: the policy tree itself
    widening = "warning"               # check --base: widening changes are warnings (read from the base only)
    [claims_ignore]                    # claims lint: per-path ignores, each with its reason (SARIF suppressions)
    "docs/vendor/*.md" = {codes = ["claims_vendor_phrasing"], reason = "upstream text, quoted verbatim"}
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ckptgate import policydata
from ckptgate._resources import default_policy_dir
from ckptgate.config.owners import SAFE_OWNERS_ENV, check_owner, safe_owners
from ckptgate.decide.extra_rego import check_extra_rego
from ckptgate.errors import ConfigError as ConfigError  # re-exported: ckptgate.config.ConfigError, as before
from ckptgate.errors import EngineUnavailable
from ckptgate.policydata import PolicyData

CONFIG_FILE = "ckptgate.toml"
PYPROJECT = "pyproject.toml"
DEFAULT_DOCS = ("README.md", "docs/**/*.md")
#: The default locations of the attestation store, the matrix and the fixtures (any path inside the
#: configuration's directory may be named instead; see :class:`ckptgate.evidence.layout.RepoLayout`).
LAYOUT = {"attestations": "attestations", "matrix": "matrix", "fixtures": "tests/fixtures/data"}
MAX_CONFIG_BYTES = 1 << 20

SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "trust": {"type": "string", "minLength": 1},
        "extra_rego": {"type": "string", "minLength": 1},
        "policy_data": {"type": "string", "minLength": 1},
        "docs": {"type": "array", "items": {"type": "string", "minLength": 1}, "uniqueItems": True},
        "attestations": {"type": "string", "minLength": 1},
        "matrix": {"type": "string", "minLength": 1},
        "fixtures": {"type": "string", "minLength": 1},
        "policies": {"type": "string", "minLength": 1},
        "widening": {"enum": ["error", "warning"]},
        "claims_ignore": {
            "type": "object",
            "additionalProperties": {
                "type": "object",
                "additionalProperties": False,
                "required": ["codes", "reason"],
                "properties": {
                    "codes": {
                        "type": "array",
                        "minItems": 1,
                        "uniqueItems": True,
                        "items": {"type": "string", "pattern": "^claims_[a-z_]+$"},
                    },
                    "reason": {"type": "string", "minLength": 3},
                },
            },
        },
    },
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """A validated configuration.  ``root`` is the directory the file is in; paths are absolute."""

    root: Path
    source: Path | None = None
    trust: Path | None = None
    extra_rego: Path | None = None
    policy_data: PolicyData | None = None
    docs: tuple[str, ...] = DEFAULT_DOCS
    attestations: Path | None = None
    matrix: Path | None = None
    fixtures: Path | None = None
    policies: Path | None = None
    #: ``check --base``: how widening changes are reported (only the base revision's setting counts)
    widening: str = "error"
    #: claims lint ignores: (path glob, codes, reason), each reported as a SARIF suppression
    claims_ignore: tuple[tuple[str, tuple[str, ...], str], ...] = ()
    #: sha256 of the configuration file's bytes, as parsed ("" for a table given in code)
    sha256: str = ""

    def to_json(self) -> dict[str, Any]:
        def rel(p: Path | None) -> str | None:
            return None if p is None else p.relative_to(self.root).as_posix()

        return {
            "root": str(self.root),
            "source": None if self.source is None else str(self.source),
            "trust": rel(self.trust),
            "extra_rego": rel(self.extra_rego),
            "policy_data": None if self.policy_data is None else rel(self.policy_data.source),
            "docs": list(self.docs),
            "attestations": rel(self.attestations),
            "matrix": rel(self.matrix),
            "fixtures": rel(self.fixtures),
            "policies": rel(self.policies),
            "widening": self.widening,
            "claims_ignore": {g: {"codes": list(c), "reason": r} for g, c, r in self.claims_ignore},
            "sha256": self.sha256,
        }

    def doc_files(self) -> list[Path]:
        """The files the docs globs match, sorted and each once (only files inside the root).  A pattern
        no system call can follow (a name longer than the file system allows) is a :class:`ConfigError`."""
        found: set[Path] = set()
        for pattern in self.docs:
            try:
                for p in self.root.glob(pattern):
                    if p.is_file() and p.resolve().is_relative_to(self.root.resolve()):
                        found.add(p)
            except OSError as e:
                where = str(self.source) if self.source is not None else "the configuration"
                raise ConfigError(
                    "usage.config.path",
                    f"{where}: docs pattern {pattern!r} cannot be matched: {e.strerror or e}",
                    evidence={"file": where, "key": "docs", "value": pattern},
                    advice=f"In {where}, give docs glob patterns whose names the file system holding {self.root} "
                    "allows, such as docs/**/*.md.",
                ) from None
        return sorted(found)


def git_root(start: Path) -> Path | None:
    """The nearest directory at or above ``start`` holding ``.git`` (a directory or a worktree file)."""
    for d in (start, *start.parents):
        if (d / ".git").exists():
            return d
    return None


def discover(start: Path | None = None) -> Path | None:
    """The configuration file nearest ``start`` (default: the cwd), walking up to the git work
    tree's root; outside one, up to the user's home or the first file-system boundary."""
    start = (start or Path.cwd()).absolute()
    top = git_root(start)
    home = _home()
    try:
        device = start.stat().st_dev
    except OSError:
        return None
    for d in (start, *start.parents):
        if top is None:
            try:
                if d.stat().st_dev != device:  # a mount point: another file system, as git stops
                    break
            except OSError:
                break
        if (d / CONFIG_FILE).is_file():
            return d / CONFIG_FILE
        if (d / PYPROJECT).is_file() and _pyproject_table(d / PYPROJECT) is not None:
            return d / PYPROJECT
        if d == top or (top is None and d == home):
            break
    return None


def _home() -> Path | None:
    try:
        return Path.home().absolute()
    except (RuntimeError, KeyError):
        return None


def load(start: Path | None = None) -> Config | None:
    """The discovered configuration, validated; ``None`` when there is none."""
    path = discover(start)
    return None if path is None else load_file(path)


def load_file(path: Path, *, root: Path | None = None) -> Config:
    """One configuration file, validated (``ckptgate.toml``, or a ``pyproject.toml`` with the table);
    its paths resolve against ``root`` (default: the file's own directory)."""
    raw = _read_bytes(path)
    table = read_table(path, raw)
    config = from_table(table, root=(root or path.parent).absolute(), source=path.absolute())
    return dataclasses.replace(config, sha256="sha256:" + hashlib.sha256(raw).hexdigest())


def read_table(path: Path, raw: bytes) -> dict[str, Any]:
    """The ckptgate table in ``raw``, the bytes of the configuration file ``path``."""
    if path.name != PYPROJECT:
        return _parse_toml(path, raw)
    table = _table_of(path, _parse_toml(path, raw))
    if table is None:
        raise ConfigError("usage.config.missing", f"{path} has no [tool.ckptgate] table", evidence={"file": str(path)})
    return table


def _read_bytes(path: Path) -> bytes:
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(
            "usage.config.unreadable", f"cannot read {path}: {e.strerror}", evidence={"file": str(path)}
        ) from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(
            "usage.config.too_large", f"{path} is over {MAX_CONFIG_BYTES} bytes", evidence={"file": str(path)}
        )
    return raw


def _read_toml(path: Path) -> dict[str, Any]:
    return _parse_toml(path, _read_bytes(path))


def _parse_toml(path: Path, raw: bytes) -> dict[str, Any]:
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(
            "usage.config.syntax", f"{path} is not valid TOML: {e}", evidence={"file": str(path)}
        ) from None
    except RecursionError:  # tomllib recurses once per nested array or inline table
        raise ConfigError(
            "usage.config.syntax",
            f"{path} nests its arrays or inline tables deeper than the TOML parser allows",
            evidence={"file": str(path)},
            advice=f"Flatten the nested arrays or inline tables in {path}; ckptgate's keys nest at most three deep.",
        ) from None


def _pyproject_table(path: Path) -> dict[str, Any] | None:
    return _table_of(path, _read_toml(path))


def _table_of(path: Path, doc: dict[str, Any]) -> dict[str, Any] | None:
    tool = doc.get("tool")
    table = tool.get("ckptgate") if isinstance(tool, dict) else None
    if table is None:
        return None
    if not isinstance(table, dict):
        raise ConfigError("usage.config.schema", f"{path}: tool.ckptgate is not a table", evidence={"file": str(path)})
    return table


def from_table(table: dict[str, Any], *, root: Path, source: Path | None = None) -> Config:
    """Validate a configuration table and resolve its paths against ``root``."""
    # Measured start-up cost: jsonschema is over 100 ms (python -X importtime), needed only once a
    # configuration file is found; a command run outside a configured repository never pays it.
    import jsonschema  # noqa: PLC0415 — measured start-up cost, above

    where = str(source) if source is not None else "the configuration"
    errors = sorted(jsonschema.Draft202012Validator(SCHEMA).iter_errors(table), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        key = ".".join(str(p) for p in e.absolute_path) or "(top level)"
        code = "usage.config.unknown_key" if e.validator == "additionalProperties" else "usage.config.schema"
        raise ConfigError(
            code, f"{where}: {key}: {e.message}", evidence={"file": where, "key": key, "problems": len(errors)}
        )

    def path(key: str, *, must_exist: bool) -> Path | None:
        value = table.get(key)
        if value is None:
            return None
        p = Path(value)
        full = (root / p).absolute()
        try:
            inside = not p.is_absolute() and full.resolve().is_relative_to(root.resolve())
            exists = full.exists()
        except (OSError, ValueError, RuntimeError) as e:  # a NUL byte, a name too long, a symlink loop
            cause = "it holds a NUL byte" if "\0" in value else str(e.strerror if isinstance(e, OSError) else e)
            raise ConfigError(
                "usage.config.path",
                f"{where}: {key} = {value!r} is no usable path: {cause}",
                evidence={"file": where, "key": key, "value": value},
                advice=f"In {where}, set {key} to the relative path of an existing file or directory inside {root}.",
            ) from None
        if not inside:
            raise ConfigError(
                "usage.config.path",
                f"{where}: {key} = {value!r} is outside {root}",
                evidence={"file": where, "key": key, "value": value},
                advice=f"In {where}, set {key} to a path relative to {root} and inside it.",
            )
        if must_exist and not exists:
            raise ConfigError(
                "usage.config.path",
                f"{where}: {key} = {value!r} does not exist",
                evidence={"file": where, "key": key, "value": value},
            )
        return full

    for pattern in table.get("docs", []):  # relative and inside the root, as every path here: pathlib refuses
        parts = PurePosixPath(pattern).parts  # an absolute pattern (NotImplementedError), and ".." walks out
        if pattern.startswith("/") or ".." in parts or "\0" in pattern:
            raise ConfigError(
                "usage.config.path",
                f"{where}: docs pattern {pattern!r} is not a relative glob inside {root}",
                evidence={"file": where, "key": "docs", "value": pattern},
                advice=f"In {where}, give docs glob patterns relative to {root} without '..', such as docs/**/*.md.",
            )
    if "matrix" in table and "fixtures" not in table:
        raise ConfigError(
            "usage.config.schema",
            f"{where}: matrix needs fixtures: the matrix is built from them",
            evidence={"file": where, "key": "matrix"},
        )
    extra = path("extra_rego", must_exist=True)
    if extra is not None:
        check_extra_rego(extra, where=where)
    policies, trust = path("policies", must_exist=True), path("trust", must_exist=True)
    data_file = path("policy_data", must_exist=True)
    attestations, matrix = path("attestations", must_exist=False), path("matrix", must_exist=False)
    fixtures = path("fixtures", must_exist=True)
    _evidence_holds_no_code(
        where,
        root,
        {"attestations": attestations, "matrix": matrix},
        {"fixtures": fixtures, "policies": policies, "trust": trust, "policy_data": data_file, "extra_rego": extra},
    )
    return Config(
        root=root,
        source=source,
        trust=trust,
        extra_rego=extra,
        policy_data=None if data_file is None else load_policy_data(data_file, policies, trust),
        docs=tuple(table.get("docs", DEFAULT_DOCS)),
        attestations=attestations,
        matrix=matrix,
        fixtures=fixtures,
        policies=policies,
        widening=table.get("widening", "error"),
        claims_ignore=claims_ignores(table),
    )


def claims_ignores(table: dict[str, Any]) -> tuple[tuple[str, tuple[str, ...], str], ...]:
    """A (validated) table's ``claims_ignore`` as sorted (path glob, codes, reason) triples."""
    raw = table.get("claims_ignore") or {}
    return tuple(sorted((str(g), tuple(v["codes"]), str(v["reason"])) for g, v in raw.items()))


def _evidence_holds_no_code(
    where: str, root: Path, evidence: dict[str, Path | None], inputs: dict[str, Path | None]
) -> None:
    """The store and the matrix are evidence: changes under them never move the candidate commit,
    so neither may be the configuration's directory itself (which holds the configuration) or
    hold the fixtures, the policies, the trust data, the overlay or the extra Rego."""
    for key, place in evidence.items():
        if place is None:
            continue
        held = inputs
        if place.resolve() == root.resolve():
            held = {"the whole repository": root}
        for what, p in held.items():
            if p is not None and p.resolve().is_relative_to(place.resolve()):
                raise ConfigError(
                    "usage.config.path",
                    f"{where}: {key} = {place.relative_to(root).as_posix()!r} "
                    f"holds {what}: evidence paths never move the candidate commit",
                    evidence={"file": where, "key": key, "holds": what},
                    advice=f"Give {key} a directory of its own.",
                )


def load_policy_data(path: Path, policies: Path | None = None, trust: Path | None = None) -> PolicyData:
    """The overlay file, validated and merged once in advance over ``policies`` (default: the
    bundled policies) and ``trust`` (default: their trust data), so a conflict stops the command
    before anything runs."""
    # Measured start-up cost: ckptgate.verify (cryptography, sigstore) is about 900 ms that `ckptgate init`
    # and every importer of this module would pay; only an overlay with signers needs it.
    from ckptgate.verify.trust import TrustData, TrustDataError  # noqa: PLC0415 — measured start-up cost, above

    data = policydata.load(path)
    if data.signers:
        try:
            TrustData.from_json(json.dumps({"signers": data.signers}).encode(), source=str(path))
        except TrustDataError as e:
            raise ConfigError(
                "usage.config.policy_data",
                f"{path}: signers: {e.message}",
                evidence={"file": str(path), "key": "signers"},
            ) from None
    try:
        base = policies or default_policy_dir()
    except EngineUnavailable:  # no policies to merge over: the engine reports that when it starts
        return data
    data.overlays(base)
    data.merge_trust((trust or base / policydata.TRUST_IN_BUNDLE).read_bytes())
    return data


__all__ = [
    "CONFIG_FILE",
    "SAFE_OWNERS_ENV",
    "Config",
    "ConfigError",
    "check_owner",
    "discover",
    "from_table",
    "load",
    "load_file",
    "load_policy_data",
    "read_table",
    "safe_owners",
]
