"""``ckptgate.producer.environment``: what the job says about itself never carries a secret into the statement."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ckptgate.producer.environment import checkpoint_records, code_ref, public_uri


@pytest.mark.parametrize(
    ("url", "public"),
    [
        ("https://alice:ghp_TOKEN@github.com/org/train.git", "https://github.com/org/train.git"),
        ("https://oauth2:glpat-TOKEN@gitlab.example/org/train", "https://gitlab.example/org/train"),
        ("https://x-access-token:TOKEN@github.com:443/org/train.git", "https://github.com:443/org/train.git"),
        ("https://github.com/org/train.git?private_token=TOKEN#frag", "https://github.com/org/train.git"),
        ("ssh://git@github.com/org/train.git", "ssh://git@github.com/org/train.git"),  # a user name, kept
        ("ssh://git:PASSWORD@github.com/org/train.git", "ssh://git@github.com/org/train.git"),
        ("https://user:pa?ss@host/org/train", "https://host/org/train"),
        ("https://[bad/org/train", "https://[bad/org/train"),  # does not parse: no ValueError, nothing to drop
        ("https://TOKEN@[bad/org/train?t=1", "https://[bad/org/train"),
        ("git@github.com:org/train.git", "git@github.com:org/train.git"),
        ("https://github.com/org/train.git", "https://github.com/org/train.git"),
    ],
)
def test_public_uri_drops_credentials(url: str, public: str) -> None:
    assert public_uri(url) == public


def test_code_ref_never_records_the_token_in_the_origin_url(tmp_path: Path) -> None:
    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    git("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "--allow-empty", "-m", "x")
    git("remote", "add", "origin", "https://alice:ghp_SECRET@github.com/org/train.git")
    ref = code_ref(tmp_path)
    assert ref is not None
    assert ref.uri == "https://github.com/org/train.git"
    assert "SECRET" not in repr(ref.to_dependency())


def test_a_checkpoint_json_nested_past_the_parser_records_nothing(tmp_path: Path) -> None:
    """config.json is read for the versions it records, best effort: one nested past the parser's
    recursion limit records nothing (`attest checkpoint` exited 1 with a RecursionError)."""
    (tmp_path / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "adapter_config.json").write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    producers, base = checkpoint_records(tmp_path, ["config.json", "adapter_config.json"])
    assert producers == [] and base is None
