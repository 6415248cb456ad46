"""``ckptgate check``: the pre-merge gate (policy tests, fmt, lint, matrix drift, evidence, claims)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from ckptgate._cli._base import UserPath, emit_json, json_option, printable, stdout
from ckptgate._cli._options import engine_options, repo_option
from ckptgate.errors import UsageError
from ckptgate.evidence.findings import CHECK_NAMES
from ckptgate.userfiles import check_output_file, write_output_file

if TYPE_CHECKING:
    from ckptgate.decide.options import EngineOptions
    from ckptgate.precedence import Resolved


def register(cli: click.Group) -> None:
    @cli.command("check")
    @click.option(
        "--sarif",
        "sarif",
        type=UserPath(dir_okay=False, path_type=Path),
        default=None,
        help="Also write a SARIF 2.1.0 report here (for code scanning).",
    )
    @click.option(
        "--junit",
        "junit",
        type=UserPath(dir_okay=False, path_type=Path),
        default=None,
        help="Also write a JUnit XML report here.",
    )
    @click.option(
        "--skip",
        multiple=True,
        type=click.Choice(list(CHECK_NAMES)),
        help="Skip a check (repeatable; reported as skipped in every output).",
    )
    @click.option(
        "--format",
        "fmt",
        type=click.Choice(["text", "json", "github"]),
        default=None,
        help="Output: text (default), json (as --json) or github (workflow annotations).",
    )
    @repo_option
    @engine_options
    @json_option
    def check_command(
        sarif: Path | None,
        junit: Path | None,
        skip: tuple[str, ...],
        fmt: str | None,
        repo: Path | None,
        engine: EngineOptions,
        resolved: Resolved,
        as_json: bool,
    ) -> int:
        """Run the pre-merge gate. Exit 0 when every check passes, 3 when any fails.

        In a repository with a ckptgate.toml (or [tool.ckptgate] in pyproject.toml), only the checks
        its configuration enables run; the others are reported as skipped, with the reason.
        """
        from ckptgate.evidence.candidate import repo_root  # noqa: PLC0415 - the evidence machinery
        from ckptgate.evidence.check import run_check, to_github, to_junit, to_sarif  # noqa: PLC0415 - the evidence machinery

        if as_json and fmt not in (None, "json"):
            raise UsageError(
                "usage.conflicting_options",
                f"--json and --format {fmt} conflict",
                advice=f"Give one of them: --json (the same as --format json) or --format {fmt}.",
            )
        as_json = as_json or fmt == "json"

        root = repo_root(repo)
        git_dirs = _git_dirs(root)
        for out, what in ((sarif, "the SARIF report"), (junit, "the JUnit report")):
            if out is not None:
                _not_an_input(root, check_output_file(out, what=what, not_inside=git_dirs), out, what, resolved)
        config = resolved.config  # the checked repository's configuration: the change under review
        options = engine if config is not None else engine.in_repo(root)
        implied = options.policy_dir if engine.policy_dir is None and config is None else None
        report = run_check(root, options=options, skip=skip, config=config, base=resolved.base, judged_policies=implied)
        if sarif is not None:
            write_output_file(
                sarif,
                (json.dumps(to_sarif(report), indent=2, sort_keys=True) + "\n").encode(),
                what="the SARIF report",
                not_inside=git_dirs,
            )
        if junit is not None:
            write_output_file(junit, to_junit(report), what="the JUnit report", not_inside=git_dirs)
        if as_json:
            emit_json(report.to_json())
        elif fmt == "github":
            for line in to_github(report):
                click.echo(line)
        else:
            for r in report.results:
                mark = "[bold green]PASS[/]" if r.passed else "[bold red]FAIL[/]"
                stdout.print(f"{mark} {r.name:13} {r.summary}", markup=True, highlight=False)
                for f in r.findings:
                    shows_file = f.file and f.file not in f.message
                    where = f" {f.file}{':' + str(f.line) if f.line else ''}" if shows_file else ""
                    quiet = f" (suppressed: {f.suppressed[1]})" if f.suppressed else ""
                    stdout.print(printable(f"       [{f.code}]{where} {f.message}{quiet}"), markup=False)
                    if f.detail and r.name in ("matrix_drift", "gate_drift"):
                        stdout.print(printable(f.detail), markup=False)
            for name in report.skipped:
                stdout.print(f"[yellow]SKIP[/] {name:13} ", markup=True, highlight=False, end="")
                stdout.print(printable(report.reason(name)), markup=False, highlight=False)
            stdout.print("check passed" if report.passed else "check FAILED (exit 3)")
        return 0 if report.passed else 3


def _git_dirs(root: Path) -> list[Path]:
    """The repository's git directory and common directory (a linked work tree has both)."""
    from ckptgate.evidence.candidate import git  # noqa: PLC0415 - the evidence machinery

    out = git(root, "rev-parse", "--git-dir", "--git-common-dir").splitlines()
    return sorted({(root / line.strip()).resolve() for line in out if line.strip()})


def _not_an_input(root: Path, target: Path, given: Path, what: str, resolved: Resolved) -> None:
    """A report replaces no file the check reads: not the configuration, not a file git tracks."""
    from ckptgate.evidence.candidate import git  # noqa: PLC0415 - the evidence machinery

    config = resolved.config.source if resolved.config is not None else None
    if not target.exists():
        return
    tracked = target.is_relative_to(root.resolve()) and bool(
        # a name such as ":(glob)*" is a file's name here, never pathspec magic
        git(root, "--literal-pathspecs", "ls-files", "-z", "--", str(target.relative_to(root.resolve())), check=False)
    )
    if tracked or (config is not None and target == config.resolve()):
        raise UsageError(
            "usage.output_inside_input",
            f"{what} {given} would replace {'the configuration' if not tracked else 'a file git tracks'} "
            f"in {root}, an input of this check",
            evidence={"path": str(given), "repository": str(root)},
            advice=f"Write {what} to a new or untracked file (such as {root / ('ckptgate-report' + given.suffix)}), "
            f"not {given}.",
        )
