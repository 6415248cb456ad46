"""The CLI's entry point: ckptgate runs on Linux only, and says so elsewhere."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ckptgate._cli._base import check_platform
from ckptgate.errors import ExitCode, UsageError


@pytest.mark.parametrize("platform", ["darwin", "win32", "freebsd14"])
def test_another_platform_is_a_typed_usage_error(platform):
    with pytest.raises(UsageError) as e:
        check_platform(platform)
    assert e.value.code == "usage.platform.unsupported" and platform in e.value.message
    assert "Linux" in e.value.message and e.value.exit_code == ExitCode.USAGE


def test_linux_passes():
    check_platform("linux")


def test_the_command_exits_with_the_error_on_another_platform():
    code = ("import sys; sys.platform = 'darwin'; sys.argv = ['ckptgate', '--json', 'doctor']\n"
            "from ckptgate._cli import main; main()")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == ExitCode.USAGE, proc.stderr
    assert json.loads(proc.stdout)["error"]["code"] == "usage.platform.unsupported"
    assert "Traceback" not in proc.stderr


def test_the_top_level_help_says_where_to_start_in_order():
    from click.testing import CliRunner

    from ckptgate._cli import commands  # noqa: F401 - registers the sub-commands
    from ckptgate._cli._base import cli

    text = CliRunner().invoke(cli, ["--help"]).output
    start = text.index("Start here")
    steps = [text.index(s, start) for s in ("ckptgate demo", "ckptgate init", "ckptgate attest keygen")]
    assert steps == sorted(steps)
    listed = text[text.index("Commands:"):]
    assert all(name in listed for name in ("demo", "init", "attest"))  # each named step is a real command


def test_a_path_option_no_system_call_can_use_is_a_usage_error():
    """A name over the file system's limit passed click.Path (it need not exist) and then made
    Path.exists raise: internal.unexpected, exit 1.  UserPath refuses it as it is parsed."""
    import click  # noqa: PLC0415

    from ckptgate._cli._base import UserPath  # noqa: PLC0415

    with pytest.raises(click.BadParameter) as e:
        UserPath(dir_okay=False).convert("a" * 300 + "/r.html", None, None)
    assert "File name too long" in e.value.message and "307 characters" in e.value.message
    assert UserPath(dir_okay=False).convert("missing/r.html", None, None) == "missing/r.html"  # left to the command


def test_every_path_option_of_the_cli_is_a_user_path():
    """The class of bug above, for options added later: no command declares a bare click.Path."""
    from pathlib import Path  # noqa: PLC0415

    cli_dir = Path(__file__).resolve().parents[2] / "src" / "ckptgate" / "_cli"
    bare = [f"{p.name}:{n}" for p in sorted(cli_dir.glob("*.py")) for n, line in
            enumerate(p.read_text().splitlines(), 1) if "click.Path(" in line]
    assert bare == []
