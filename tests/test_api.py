"""``ckptgate.api``: the example in docs/api.md runs as written, and the functions agree with the CLI."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from ckptgate import api
from ckptgate.errors import Error, PolicyDenied, VerificationError
from tests.pipeline_helpers import FIXTURES, demo_attested

REPO = Path(__file__).resolve().parent.parent


def test_the_documented_example_runs(tmp_path):
    [example] = re.findall(r"```python\n(.*?)```", (REPO / "docs" / "api.md").read_text(), re.S)
    src = tmp_path / "model"
    shutil.copytree(FIXTURES / "hf_sharded" / "checkpoint", src)
    scope = {"CHECKPOINT": src, "OUT": tmp_path / "out"}
    exec(compile(example, "docs/api.md", "exec"), scope)  # the repository's own document
    assert scope["denied"][1] in (3, 5)


def test_intake_publishes_on_allow_and_raises_typed_errors_on_deny(tmp_path):
    src = tmp_path / "model"
    shutil.copytree(FIXTURES / "hf_sharded" / "checkpoint", src)
    att = demo_attested(src, tmp_path)
    options = api.EngineOptions(trust_file=att.trust)
    report = api.verify(src, [att.attestation], options=options)
    assert report.allow, report.reasons
    result = api.intake(src, tmp_path / "out", [att.attestation], options=options)
    assert (tmp_path / "out" / "model.safetensors.index.json").is_file() and result.receipt
    with pytest.raises((PolicyDenied, VerificationError)) as e:
        api.intake(src, tmp_path / "out2", [att.attestation])  # the bundled trust does not know the key
    assert isinstance(e.value, Error) and e.value.code and not (tmp_path / "out2").exists()
