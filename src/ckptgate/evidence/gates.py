"""What the policy data says about a fixture: the adapter that consolidates its format, the
producer that adapter's version gate names, and how long evidence stays valid."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from ckptgate.consolidate.adapters import adapter_name_for
from ckptgate.errors import Error
from ckptgate.evidence.fixtures import Fixture, list_fixtures
from ckptgate.evidence.layout import RepoLayout, as_layout
from ckptgate.inspect import Inspection, SafeTree, inspect_open_tree

GATES_IN_BUNDLE = "ckptgate/config/gates/data.json"
INTAKE_IN_BUNDLE = "ckptgate/config/intake/data.json"
#: Relative to ckptgate's own repository; a layout reads them from its policies (with the overlay).
GATES_DATA = Path("policies") / GATES_IN_BUNDLE
INTAKE_DATA = Path("policies") / INTAKE_IN_BUNDLE
DEFAULT_VALIDITY = timedelta(days=180)


def gates_data(repo: Path | RepoLayout) -> dict[str, Any] | None:
    """The gates data of the layout's policies, the policy-data overlay merged over it (None: unreadable)."""
    return as_layout(repo).policy_json(GATES_IN_BUNDLE)


def adapter_for_format(repo: Path | RepoLayout, fmt: str) -> str | None:
    """The adapter that consolidates an inspected format (None when none can), from the adapter
    registry; a test keeps the registry and the gates data's ``formats`` in step."""
    return adapter_name_for(fmt)


def gate_producer(repo: Path | RepoLayout, adapter: str) -> str | None:
    """The producer the adapter's version gate names (``*`` or absent: any)."""
    gates = gates_data(repo)
    if gates is None:
        return None
    producer = ((gates.get("adapters") or {}).get(adapter) or {}).get("producer")
    return producer if isinstance(producer, str) else None


def fixture_format(repo: Path | RepoLayout, fixture: Fixture, inspection: Inspection | None = None) -> str:
    """The format the gates data knows the fixture by: ``meta.json``'s when the gates data lists it
    (``peft-lora``), else the format the static inspection reports (``deepspeed-zero`` for a fixture
    recorded as ``deepspeed-zero2``).  Inspection reads, never loads; a refused tree keeps the meta format.
    A caller that has already inspected the fixture passes that ``inspection``, and it is not read again."""
    gates = gates_data(repo)
    if gates is None:
        return fixture.format
    if fixture.format in (gates.get("formats") or {}):
        return fixture.format
    if inspection is not None:
        inspected = inspection.format
    else:
        try:
            with SafeTree.open(fixture.checkpoint) as tree:
                inspected = inspect_open_tree(tree).format
        except Error:
            return fixture.format
    return inspected if isinstance(inspected, str) and inspected else fixture.format


def fixture_adapter(repo: Path | RepoLayout, fixture: Fixture) -> str | None:
    """The adapter that consolidates the fixture's format (:func:`fixture_format`), or None."""
    return adapter_for_format(repo, fixture_format(repo, fixture))


def validity(repo: Path | RepoLayout) -> timedelta:
    """How long evidence stays valid: the intake data's ``freshness.max_age_seconds`` (the
    configuration's policy-data overlay merged over the policies' own), else :data:`DEFAULT_VALIDITY`."""
    cfg = as_layout(repo).policy_json(INTAKE_IN_BUNDLE)
    try:
        return timedelta(seconds=int(cfg["freshness"]["max_age_seconds"]))  # type: ignore[index]
    except (KeyError, TypeError, ValueError):
        return DEFAULT_VALIDITY


def qualifiable(repo: Path | RepoLayout) -> list[tuple[Fixture, str]]:
    """Every fixture whose format the gates data maps to an adapter, with that adapter: a fixture whose
    expected output is the consolidated weights qualifies the adapter's name-preserving reading, one
    whose expected output is the producer's logits (with ``hf_config/``) qualifies a mapping row."""
    out = []
    for f in list_fixtures(repo):
        if f.expected_kind not in ("weights", "logits"):
            continue
        adapter = fixture_adapter(repo, f)
        if adapter is not None:
            out.append((f, adapter))
    return out


__all__ = [
    "DEFAULT_VALIDITY",
    "GATES_DATA",
    "GATES_IN_BUNDLE",
    "INTAKE_DATA",
    "INTAKE_IN_BUNDLE",
    "adapter_for_format",
    "fixture_adapter",
    "fixture_format",
    "gate_producer",
    "gates_data",
    "qualifiable",
    "validity",
]
