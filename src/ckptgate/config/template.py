"""``ckptgate init``: the commented ``ckptgate.toml`` it writes, never over an existing one."""

from __future__ import annotations

from pathlib import Path

from ckptgate.config import CONFIG_FILE, discover, git_root
from ckptgate.errors import ConfigError, UsageError

INIT_TEMPLATE = """\
# ckptgate configuration (https://ckptgate.dev/docs/user-guide#configuration).
# Every ckptgate command run inside this repository reads it. Paths are relative to this file.

# Trust data: the signers whose attestations count. `ckptgate attest keygen --trust-out trust.json`
# writes one. An explicit --trust on the command line wins. Default: the bundled trust data.
# trust = "trust.json"

# A directory of extra Rego, loaded beside the bundled policies; it can only add reasons to deny.
# Its packages are ckptgate_consumer or below it; it may read data.ckptgate and the input, and each
# {"code": ..., "message": ...} in the set data.ckptgate_consumer.deny denies as consumer.<code>
# (exit 3). `ckptgate check` runs its tests, opa fmt and regal lint on it.
# extra_rego = "policy"

# A policy-data overlay (JSON), merged over the bundled data: extra signers, the producer-version
# gates of bundled adapters, extra finding exceptions, and the attestation freshness window.
# See the user guide's Configuration section for the merge rule.
# policy_data = "ckptgate-data.json"

# What the claims lint reads: glob patterns, relative to this file.
docs = ["README.md", "docs/**/*.md"]

# The attestation store.
# attestations = "attestations"

# The support matrix and the fixtures it is built from: set both only if this repository
# qualifies adapters. Without them `ckptgate check` lints claims against an empty matrix.
# matrix = "matrix"
# fixtures = "tests/fixtures/data"
"""


def init(start: Path) -> Path:
    """Write ``ckptgate.toml`` with commented defaults at the top of the git work tree holding
    ``start``; never overwrites, and outside a work tree writes nothing."""
    directory = git_root(start.absolute())
    if directory is None:
        raise UsageError(
            "usage.init.no_work_tree",
            f"{start} is not inside a git work tree, so there is no top of one to write {CONFIG_FILE} at",
            evidence={"directory": str(start)},
            advice=f"Run `ckptgate init` inside your repository, or make {start} one first with `git init`.",
        )
    target = directory / CONFIG_FILE
    existing = discover(directory)
    if existing is not None:
        raise ConfigError(
            "usage.config.exists",
            f"{existing} already configures ckptgate here",
            evidence={"file": str(existing)},
            advice="Edit that file; `ckptgate init` never overwrites.",
        )
    try:
        with target.open("x", encoding="utf-8") as f:
            f.write(INIT_TEMPLATE)
    except FileExistsError:
        raise ConfigError(
            "usage.config.exists",
            f"{target} already exists",
            evidence={"file": str(target)},
            advice="Edit that file; `ckptgate init` never overwrites.",
        ) from None
    except OSError as e:
        raise ConfigError(
            "usage.config.unwritable", f"cannot write {target}: {e.strerror}", evidence={"file": str(target)}
        ) from None
    return target
