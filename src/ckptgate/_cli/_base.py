"""The ``ckptgate`` command group, error translation and output helpers."""

from __future__ import annotations

import errno
import json
import os
import re
import signal
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.markup import escape

from ckptgate import __version__, interrupts
from ckptgate._cli._streams import guarded
from ckptgate.errors import Aborted, Error, ExitCode, UsageError

# soft_wrap: a line is never wrapped or cut to the terminal's width (a code, digest or path must
# survive a pipe whole); off a terminal, rich prints no colour and no progress bars.
stderr = Console(stderr=True, highlight=False, soft_wrap=True)
stdout = Console(highlight=False, soft_wrap=True)

#: A command function, as click's decorators take and return it.
F = TypeVar("F", bound=Callable[..., Any])


class UserPath(click.Path):
    """``click.Path`` that also refuses, as it parses, a path no system call can use: a name longer
    than the file system allows (``ENAMETOOLONG``), a directory on the way this user may not search
    (``EACCES``), a symbolic-link loop.  ``click.Path`` lets such a path through unless it must exist,
    and the later checks (``Path.exists``, ``Path.is_dir``) raise on it instead of answering, which
    ended a command as ``internal.unexpected``.  A path that does not exist yet, or whose parent is
    a file, is left to the command, which names that case with its own code.  Every path option of
    the CLI is of this type (tests/_cli/test_base.py checks that no ``click.Path`` is left)."""

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> str | bytes | os.PathLike[str]:
        converted = super().convert(value, param, ctx)
        try:
            os.lstat(os.fsdecode(converted))
        except OSError as e:
            if e.errno not in (errno.ENOENT, errno.ENOTDIR):
                shown_value = os.fsdecode(value)
                if len(shown_value) > 120:
                    shown_value = f"{shown_value[:60]}...{shown_value[-40:]} ({len(shown_value)} characters)"
                self.fail(f"{shown_value!r} is not a usable path: {e.strerror or e}", param, ctx)
        return converted


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[str]]) -> None:
    """A table on stdout: drawn with rich on a terminal (cells fold, never cut); elsewhere one
    tab-separated line per row under a ``# title`` line, so logs and ``grep`` see every value whole
    and unpadded.  Cells are rich markup, as :func:`shown` makes them."""
    if stdout.is_terminal:
        from rich.table import Table  # noqa: PLC0415 - only humans at a terminal pay its import

        t = Table(*columns, title=title)
        for c in t.columns:
            c.overflow = "fold"
        for row in rows:
            t.add_row(*row)
        stdout.print(t)
        return
    stdout.print(f"# {title}: " + "\t".join(columns), markup=False)
    for row in rows:
        stdout.print("\t".join(row))


def print_json_text(doc: Any) -> None:
    """Pretty JSON for humans: highlighted on a terminal, plain text elsewhere (never padded)."""
    text = json.dumps(doc, indent=2, sort_keys=True)
    if stdout.is_terminal:
        from rich.syntax import Syntax  # noqa: PLC0415 - pulls in pygments: only at a terminal

        stdout.print(Syntax(text, "json", word_wrap=True))
    else:
        stdout.print(text, markup=False)


# C0 controls but tab and newline, DEL, C1 controls, and the bidirectional overrides: a checkpoint's
# file names and an attestation's fields reach the terminal, and must not drive it
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: object) -> str:
    """``text`` with every terminal control character shown as an escape (``\\x1b``)."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))


def shown(text: object) -> str:
    """:func:`printable`, and safe inside rich markup."""
    return escape(printable(text))


_LINE_BREAKS = re.compile("[\t\n]")


def shown_line(text: object) -> str:
    """:func:`shown`, on one line: a tab or line break in a value read from a file (a receipt's file name or
    engine URL) is shown as an escape too, so it cannot print a line of its own (``receipt verified``)."""
    return shown(_LINE_BREAKS.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text)))


def emit_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


def report_error(err: Error, as_json: bool) -> None:
    if as_json:
        emit_json(err.to_json())
        return
    stderr.print(f"[bold red]error[/] {shown('[' + err.code + ']')} {shown(err.message)}")
    for r in err.reasons:
        stderr.print(f"  - {shown('[' + str(r.get('code', '?')) + ']')} {shown(r.get('message', ''))}")
    stderr.print(f"[dim]advice:[/] {shown(err.diagnostics())}")


def json_option(f: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON on stdout.")(f)


def check_platform(platform: str | None = None) -> None:
    """ckptgate runs on Linux only: it relies on ``openat2``, namespaces and seccomp."""
    platform = platform or sys.platform
    if not platform.startswith("linux"):
        raise UsageError(
            "usage.platform.unsupported",
            f"ckptgate runs on Linux only, not on {platform}: it relies on openat2, namespaces and seccomp",
            evidence={"platform": platform},
            advice=f"Run ckptgate on a Linux host (kernel 5.6 or later), or in a Linux container or virtual "
            f"machine on this {platform} host.",
        )


def _usage_advice(ctx: click.Context | None) -> str:
    """The help of the command that was run (``ckptgate intake --help``), not "the command"."""
    path = ctx.command_path if ctx is not None else "ckptgate"
    return f"Check the value the message names; `{path} --help` lists the arguments and options of `{path}`."


class _Group(click.Group):
    """Maps click's usage errors to our exit code 2 and keeps them traceback-free; installs the
    handlers of SIGHUP, SIGINT and SIGTERM (:mod:`ckptgate.interrupts`) and guards the output
    streams against a closed reader (:mod:`ckptgate._cli._streams`) for every command."""

    def main(self, *args: Any, **kwargs: Any) -> Any:
        sys.exit(launched(lambda: self._run(*args, **kwargs)))

    def _run(self, *args: Any, **kwargs: Any) -> int:
        kwargs["standalone_mode"] = False
        as_json = "--json" in sys.argv
        try:
            check_platform()
            rv = super().main(*args, **kwargs)
        except click.exceptions.Exit as e:
            return int(e.exit_code)
        except click.Abort:  # click's KeyboardInterrupt: where our handlers are not installed (not the main thread)
            report_error(Aborted(signal.SIGINT), as_json)
            return int(ExitCode.INTERRUPTED)
        except click.UsageError as e:
            report_error(UsageError("usage.invalid", e.format_message(), advice=_usage_advice(e.ctx)), as_json)
            return int(ExitCode.USAGE)
        except click.ClickException as e:
            report_error(UsageError("usage.invalid", e.format_message(), advice=_usage_advice(None)), as_json)
            return int(ExitCode.USAGE)
        except Error as e:
            report_error(e, as_json)
            return int(e.exit_code)
        except Exception as e:  # the last line of defence: no traceback
            report_error(Error("internal.unexpected", f"{type(e).__name__}: {e}"), as_json)
            return int(ExitCode.INTERNAL)
        return int(rv or 0)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="ckptgate")
def cli() -> None:
    """ckptgate: a policy-as-code gate for distributed-training checkpoints.

    Start here: `ckptgate demo` (a small real checkpoint signed with a throwaway key and taken in, end to
    end), then `ckptgate init` (a ckptgate.toml for your repository), then `ckptgate attest keygen`
    (your own signing key and trust data).

    Exit codes: 0 ok, 1 internal error, 2 usage error, 3 policy denied, 4 input rejected,
    5 verification failed, 6 policy engine unavailable, 7 contained runtime failed,
    129/130/143 stopped by SIGHUP/SIGINT/SIGTERM before publishing (nothing was published).
    A signal after the publishing rename, or a closed stdout, never changes the outcome's code.
    """


def launched(run: Callable[[], int]) -> int:
    """``run()``'s exit code, under the handlers of SIGHUP, SIGINT and SIGTERM
    (:func:`ckptgate.interrupts.handling`) and with the output streams guarded against a closed
    reader (:func:`ckptgate._cli._streams.guarded`); a signal before the commit point is reported as
    :class:`~ckptgate.errors.Aborted` (exit 129, 130 or 143).  Nested calls share the outer one's."""
    with interrupts.handling(), guarded():
        try:
            return run()
        except interrupts.Interrupted as e:  # before the commit point: nothing was published
            err = e.error()
            report_error(err, "--json" in sys.argv)
            return int(err.exit_code)
