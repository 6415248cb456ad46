"""One rule for the exit code of a deny, whichever command asks (issue 19, item 1).

The policy names what a deny stands for (``refusal``); ``intake``, ``decide``, ``explain`` and
``verify`` exit by it alike: 4 for the checkpoint's own content, 5 when failed or untrusted
signatures alone explain it, 3 otherwise.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ckptgate.errors import ExitCode
from tests.pipeline_helpers import demo_attested

HF = Path(__file__).resolve().parent / "fixtures" / "data" / "hf_sharded" / "checkpoint"
COMMANDS = ("intake", "decide", "explain", "verify")


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("exit")
    src = tmp / "ckpt"
    shutil.copytree(HF, src)
    good = demo_attested(src, tmp, name="good").attestation
    tampered = tmp / "tampered.json"
    doc = json.loads(good.read_bytes())
    sig = doc["signatures"][0]["sig"]
    doc["signatures"][0]["sig"] = ("A" if sig[0] != "A" else "B") + sig[1:]
    tampered.write_text(json.dumps(doc))
    broken = tmp / "broken"
    shutil.copytree(src, broken)
    shard = broken / "model-00001-of-00003.safetensors"
    raw = bytearray(shard.read_bytes())
    raw[8:10] = b"[]"  # the header is no longer a JSON object: a malformed checkpoint
    shard.write_bytes(bytes(raw))
    return {"src": src, "broken": broken, "good": good, "tampered": tampered, "trust": tmp / "trust.json",
            "tmp": tmp}


def _run(command, src, attestation, case):
    args = [command, str(src), "--trust", str(case["trust"]), "--json"]
    if attestation is not None:
        args += ["--attestation", str(attestation)]
    if command == "intake":
        args += ["--out", str(case["tmp"] / f"out-{command}-{src.name}-{os.getpid()}")]
    return subprocess.run([sys.executable, "-m", "ckptgate", *args], capture_output=True, text=True, timeout=180,
                          env=dict(os.environ))


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(("which", "attestation", "expected"), [
    ("src", "tampered", ExitCode.VERIFICATION_FAILED),  # a bad signature alone explains the deny
    ("src", None, ExitCode.DENIED),  # nothing offered: a policy deny, not a verification failure
    ("broken", "tampered", ExitCode.INPUT_REJECTED),  # the checkpoint itself first, whatever else fails
])
def test_every_command_gives_a_deny_the_same_exit_code(case, command, which, attestation, expected):
    res = _run(command, case[which], case[attestation] if attestation else None, case)
    assert res.returncode == expected, (res.stdout[-2000:], res.stderr[-2000:])
    assert "Traceback" not in res.stderr
    doc = json.loads(res.stdout)
    if "error" in doc:  # intake: the error names the same reasons
        assert doc["error"]["exit_code"] == expected
    else:
        decision = doc["decision"]
        assert decision["allow"] is False
        assert {ExitCode.INPUT_REJECTED: "input", ExitCode.VERIFICATION_FAILED: "verification",
                ExitCode.DENIED: "policy"}[expected] == decision["refusal"]


def test_inspect_agrees_on_a_malformed_checkpoint(case):
    res = subprocess.run([sys.executable, "-m", "ckptgate", "inspect", str(case["broken"]), "--json"],
                         capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert res.returncode == ExitCode.INPUT_REJECTED
