"""``ckptgate._resources``: where ckptgate's own files are; the policy directory used by default
(``$CKPTGATE_POLICIES``, else the packaged policies, else the clone's)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ckptgate import _resources
from ckptgate._resources import default_policy_dir
from ckptgate.errors import EngineUnavailable

REPO = Path(__file__).resolve().parents[1]


def test_policies_come_from_the_package_when_it_carries_them(tmp_path, monkeypatch):
    monkeypatch.delenv("CKPTGATE_POLICIES", raising=False)
    assert default_policy_dir() == REPO / "policies"  # a clone carries no packaged copy
    packaged = tmp_path / "_policies"
    packaged.mkdir()
    monkeypatch.setattr(_resources, "packaged_policies", lambda: packaged)
    assert default_policy_dir() == packaged


def test_an_installation_without_policies_is_a_typed_error(monkeypatch):
    monkeypatch.delenv("CKPTGATE_POLICIES", raising=False)
    monkeypatch.setattr(_resources, "policies_dir", lambda: None)
    with pytest.raises(EngineUnavailable) as e:
        default_policy_dir()
    assert e.value.code == "engine.policies.missing" and "--policies" in e.value.diagnostics()


def test_an_explicit_policy_directory_wins_and_must_exist(tmp_path, monkeypatch):
    monkeypatch.setenv("CKPTGATE_POLICIES", str(tmp_path))
    assert default_policy_dir() == tmp_path
    monkeypatch.setenv("CKPTGATE_POLICIES", str(tmp_path / "absent"))
    with pytest.raises(EngineUnavailable) as e:
        default_policy_dir()
    assert e.value.code == "engine.policies.missing" and str(tmp_path / "absent") in e.value.message


def test_the_pinned_go_tools_equal_pins_toml():
    import tomllib

    pins = tomllib.loads((REPO / "pins.toml").read_text())["tools"]
    assert {name: tool.spec for name, tool in _resources.GO_TOOLS.items()} == pins
    assert _resources.GO_TOOLS["opa"].version == _resources.OPA_PINNED
    assert _resources.GO_TOOLS["regal"].version == _resources.REGAL_PINNED
