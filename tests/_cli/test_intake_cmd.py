"""``ckptgate intake``'s options that shape the run, not its result: ``--workers`` (issue #36)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from click.testing import CliRunner

import ckptgate.pipeline as pipeline
from ckptgate._cli import commands  # noqa: F401 - registers the sub-commands
from ckptgate._cli._base import cli


def _recording(monkeypatch) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def intake(src: Path, dst: Path, **kwargs: Any) -> Any:
        seen.update(kwargs)
        raise SystemExit(0)  # what the intake would do is not this test's concern

    monkeypatch.setattr(pipeline, "intake", intake)
    return seen


def test_workers_reaches_the_intake(tmp_path, monkeypatch):
    seen = _recording(monkeypatch)
    result = CliRunner().invoke(cli, ["intake", str(tmp_path), "--out", str(tmp_path / "out"), "--workers", "3"])
    assert result.exit_code == 0, result.output
    assert seen["workers"] == 3


def test_workers_defaults_to_the_cores_and_below_one_is_refused(tmp_path, monkeypatch):
    seen = _recording(monkeypatch)
    CliRunner().invoke(cli, ["intake", str(tmp_path), "--out", str(tmp_path / "out")])
    assert "workers" in seen and seen["workers"] is None  # None: the library uses the cores it may run on
    refused = CliRunner().invoke(cli, ["intake", str(tmp_path), "--out", str(tmp_path / "out"), "--workers", "0"])
    assert refused.exit_code == 2 and "--workers" in refused.output
    help_text = CliRunner().invoke(cli, ["intake", "--help"]).output
    assert "--workers" in help_text and "cores" in help_text
