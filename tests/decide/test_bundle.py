"""Finding OPA (``--opa-binary``, ``$CKPTGATE_OPA``, ``PATH``, the clone's ``.tools/bin``), its
supported versions.  (The policies the package carries: ``tests/test_resources.py``.)"""

from __future__ import annotations

import textwrap
import tomllib
from pathlib import Path

import pytest

from ckptgate import _resources
from ckptgate.decide import bundle
from ckptgate.decide.bundle import OPA_PINNED, find_opa, opa_version_supported, parse_opa_version, select_opa_binary
from ckptgate.errors import EngineUnavailable, ExitCode

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_selection(monkeypatch):
    monkeypatch.setattr(bundle, "_selected_opa", None)
    monkeypatch.setattr(bundle, "_checked", {})


def fake_opa(tmp_path: Path, name: str, version: str) -> Path:
    p = tmp_path / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        [ "$1" = version ] && echo "Version: {version}" && echo "Build Commit: x" && exit 0
        exit 9
        """))
    p.chmod(0o755)
    return p


def test_the_pinned_version_is_the_one_pins_toml_pins():
    pins = tomllib.loads((REPO / "pins.toml").read_text())
    assert pins["tools"]["opa"].endswith("@v" + ".".join(map(str, OPA_PINNED)))


@pytest.mark.parametrize(("text", "want"), [("Version: 1.22.3\nBuild Commit: \n", (1, 22, 3)),
                                            ("Version: v1.30.0\n", (1, 30, 0)), ("opa 1.22.3\n", None)])
def test_opa_version_is_parsed_from_its_version_line(text, want):
    assert parse_opa_version(text) == want


@pytest.mark.parametrize(("version", "ok"), [((1, 22, 3), True), ((1, 22, 4), True), ((1, 40, 0), True),
                                             ((1, 22, 2), False), ((1, 0, 0), False), ((0, 70, 0), False),
                                             ((2, 0, 0), False)])
def test_supported_versions_are_the_pin_and_later_releases_of_its_major(version, ok):
    assert opa_version_supported(version) is ok


def test_lookup_order_is_flag_then_environment_then_path_then_clone(tmp_path, monkeypatch):
    flag = fake_opa(tmp_path, "flag/opa", "1.22.3")
    env = fake_opa(tmp_path, "env/opa", "1.23.0")
    on_path = fake_opa(tmp_path, "path/opa", "1.24.0")
    monkeypatch.setenv("PATH", str(on_path.parent))
    monkeypatch.setenv("CKPTGATE_OPA", str(env))
    select_opa_binary(flag)
    assert find_opa() == str(flag)
    select_opa_binary(None)
    assert find_opa() == str(env)
    monkeypatch.delenv("CKPTGATE_OPA")
    assert find_opa() == str(on_path)
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    clone = _resources.clone_tool("opa")
    if clone is None:
        pytest.skip("no development clone with .tools/bin/opa here")
    assert find_opa() == str(clone)


def test_no_opa_anywhere_names_every_way_in(tmp_path, monkeypatch):
    monkeypatch.delenv("CKPTGATE_OPA", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(_resources, "source_root", lambda: None)
    with pytest.raises(EngineUnavailable) as e:
        find_opa()
    assert e.value.code == "engine.opa.not_installed" and e.value.exit_code == ExitCode.ENGINE_UNAVAILABLE
    advice = e.value.diagnostics()
    assert all(way in advice for way in ("ckptgate engine install", "--opa-binary", "CKPTGATE_OPA", "PATH",
                                         "--opa-url"))


@pytest.mark.parametrize("version", ["1.22.2", "0.70.0", "2.0.0"])
def test_an_unsupported_opa_is_refused_naming_its_version_and_the_range(tmp_path, monkeypatch, version):
    """Capability: engine version check (an OPA outside the supported range is refused)."""
    monkeypatch.setenv("CKPTGATE_OPA", str(fake_opa(tmp_path, "opa", version)))
    with pytest.raises(EngineUnavailable) as e:
        find_opa()
    assert e.value.code == "engine.opa.unsupported_version"
    assert version in e.value.message and e.value.evidence["supported"] == bundle.OPA_SUPPORTED


def test_a_named_binary_that_does_not_exist_is_refused_naming_its_source(tmp_path):
    select_opa_binary(tmp_path / "missing")
    with pytest.raises(EngineUnavailable) as e:
        find_opa()
    assert e.value.code == "engine.opa.not_installed" and e.value.evidence["source"] == "--opa-binary"


def test_a_binary_that_is_not_opa_is_refused(tmp_path, monkeypatch):
    p = tmp_path / "opa"
    p.write_text("#!/bin/sh\necho hello\n")
    p.chmod(0o755)
    monkeypatch.setenv("CKPTGATE_OPA", str(p))
    with pytest.raises(EngineUnavailable) as e:
        find_opa()
    assert e.value.code == "engine.opa.unsupported_version" and e.value.evidence["version"] == "unknown"


def test_the_receipts_opa_version_is_the_one_the_check_reported_without_a_second_run(tmp_path, monkeypatch):
    """Issue #22: the receipt's ``opa_version`` comes from the ``opa version`` run that checked the
    binary when the engine launched it, not from a second ``opa version`` at the end of the intake."""
    from ckptgate import pipeline

    first = fake_opa(tmp_path, "a/opa", "v1.30.0")  # reported as written, "v" included
    monkeypatch.setenv("CKPTGATE_OPA", str(first))
    assert find_opa() == str(first)
    runs = []
    real = bundle.subprocess.run
    monkeypatch.setattr(bundle.subprocess, "run", lambda *a, **k: runs.append(a) or real(*a, **k))
    assert pipeline.local_opa_version() == bundle.opa_version() == "v1.30.0"
    assert runs == []  # already checked: no process started
    second = fake_opa(tmp_path, "b/opa", "1.31.2")  # a binary not checked yet is checked once
    monkeypatch.setenv("CKPTGATE_OPA", str(second))
    assert pipeline.local_opa_version() == "1.31.2" and pipeline.local_opa_version() == "1.31.2"
    assert len(runs) == 1
    monkeypatch.setenv("CKPTGATE_OPA", str(fake_opa(tmp_path, "c/opa", "0.70.0")))  # unsupported: none
    assert pipeline.local_opa_version() is None
