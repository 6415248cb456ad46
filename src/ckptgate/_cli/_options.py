"""Options shared by the commands that consult the policy engine."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from ckptgate.pipeline import EngineOptions


def engine_options(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option("--opa-url", envvar="CKPTGATE_OPA_URL", default=None,
                     help="Use the OPA server at this URL instead of the embedded one "
                          "(token from CKPTGATE_OPA_TOKEN).")(f)
    f = click.option("--opa-timeout", type=click.FloatRange(0.01, 600), default=5.0, show_default=True,
                     help="Seconds to wait for a decision; a late decision is deny.")(f)
    f = click.option("--policies", "policy_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
                     help="Policy directory for the embedded OPA (default: the bundled policies/).")(f)
    f = click.option("--trust", "trust_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
                     help="Trust data file (default: policies/ckptgate/config/trust/data.json).")(f)
    return f


def to_engine_options(opa_url: str | None, opa_timeout: float, policy_dir: Path | None,
                      trust_file: Path | None) -> EngineOptions:
    import os

    return EngineOptions(opa_url=opa_url, opa_token=os.environ.get("CKPTGATE_OPA_TOKEN"), policy_dir=policy_dir,
                         trust_file=trust_file, timeout_s=opa_timeout)
