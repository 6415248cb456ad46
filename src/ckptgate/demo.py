"""The demo intake: a real, freshly produced checkpoint through the whole gate, offline.

1. A tiny model's state dict is saved with ``huggingface_hub.save_torch_state_dict`` as HF
   sharded safetensors (several shards and an index), exactly as a producer would.
2. A throwaway Ed25519 key is made; trust data naming only that key is written beside it.
3. The fixture digest is measured and a qualification statement about it is signed (DSSE).
4. ``intake`` runs on the embedded OPA with that trust data, and the output is compared with
   the input tensors, bit for bit.
"""

from __future__ import annotations

import importlib.util
import json
import platform
import subprocess
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from ckptgate.decide import now_utc
from ckptgate.decide.options import EngineOptions
from ckptgate.digest import Digest, fixture_digest
from ckptgate.errors import Error, UsageError
from ckptgate.inspect import SafeTree
from ckptgate.pipeline import IntakeResult, intake
from ckptgate.verify import QUALIFICATION_PREDICATE_TYPE, KeySigner, generate_keypair, trust_entry
from ckptgate.verify.dsse import sign_statement, write_private_key
from ckptgate.verify.statement import qualification_statement


class DemoFailed(Error):
    default_advice = "The demo's own check failed; this is a bug in ckptgate: report it with `ckptgate demo --json`."


@dataclass(frozen=True, slots=True, kw_only=True)
class DemoResult:
    source: Path
    attestation: Path
    trust_file: Path
    intake: IntakeResult
    tensors_compared: int


def require_torch() -> None:
    """The demo produces its checkpoint with torch and huggingface_hub, which the core install
    leaves out; without them it stops with ``usage.demo_needs_torch`` before touching anything."""
    missing = [name for name in ("torch", "huggingface_hub") if importlib.util.find_spec(name) is None]
    if missing:
        raise UsageError(
            "usage.demo_needs_torch",
            f"the demo makes its checkpoint with torch and huggingface_hub, "
            f"and this installation lacks {' and '.join(missing)}",
            evidence={"missing": missing},
            advice="Install the framework extra: pip install 'ckptgate[torch]'. The core install "
            "still inspects, verifies and decides on checkpoints you already have.",
        )


def make_checkpoint(out: Path, *, seed: int = 0) -> dict[str, Any]:
    """Save a tiny MLP's state dict as HF sharded safetensors; return the tensors (torch)."""
    import torch  # noqa: PLC0415 — torch, heavy optional (the [torch] extra; the core install has none)
    from huggingface_hub import save_torch_state_dict  # noqa: PLC0415 — huggingface_hub, heavy optional (the [torch] extra)

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16))
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    state["embed.weight"] = torch.randn(50, 32, dtype=torch.bfloat16)
    state["step"] = torch.tensor([7], dtype=torch.int64)
    out.mkdir(parents=True, exist_ok=True)
    save_torch_state_dict(state, str(out), max_shard_size=6000)
    return state


def git_head() -> str:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=Path(__file__).resolve().parent,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        head = ""
    return head if len(head) == 40 else "0" * 40


def demo_statement(digest: Digest, manifest: str, *, producer: tuple[str, str]) -> dict[str, Any]:
    """A qualification statement for the demo checkpoint, valid for one hour."""
    import torch  # noqa: PLC0415 — torch, heavy optional (the [torch] extra; the core install has none)

    return qualification_statement(
        subject_name="demo-checkpoint",
        fixture_digest=digest,
        manifest=manifest,
        producer={"name": producer[0], "version": producer[1]},
        adapter={"name": "hf-safetensors", "version": "1"},
        candidate_commit=git_head(),
        environment={
            "python": platform.python_version(),
            "torch": torch.__version__,
            "os": platform.system().lower(),
            "arch": platform.machine(),
            "accelerator": "cpu",
        },
        topology={"tp": 1, "pp": 1, "dp": 1, "cp": 1, "ep": 1, "etp": 1, "world_size": 1},
        status="passed",
        checks_run=["demo-roundtrip"],
        evidence_digest=digest.prefixed(),
        evidence_location="demo",
        issued_at=now_utc(),
        valid_for=timedelta(hours=1),
    )


def run_demo(workdir: Path, *, options: EngineOptions | None = None) -> DemoResult:
    """Produce, sign, take in, and check.  ``workdir`` must not exist or be empty."""
    require_torch()
    import huggingface_hub  # noqa: PLC0415 — huggingface_hub, heavy optional (the [torch] extra)
    import torch  # noqa: PLC0415 — torch, heavy optional (the [torch] extra; the core install has none)
    from safetensors.torch import load_file  # noqa: PLC0415 — torch, heavy optional (the [torch] extra; the core install has none)

    try:
        workdir.mkdir(parents=True, exist_ok=True)
        empty = not any(workdir.iterdir())
    except OSError as e:
        raise UsageError(
            "usage.workdir",
            f"cannot use {workdir} as the demo's directory: {e.strerror}",
            advice="Pass an empty directory this user can write with --workdir, or leave --workdir out.",
        ) from None
    if not empty:
        raise UsageError("usage.workdir", f"{workdir} is not empty", advice="Pass an empty --workdir.")
    src, out = workdir / "checkpoint", workdir / "published"
    state = make_checkpoint(src)

    private_pem, public_pem = generate_keypair("ed25519")
    key_path = workdir / "demo-signing-key.pem"
    write_private_key(key_path, private_pem)
    trust_file = workdir / "trust.json"
    trust_file.write_text(
        json.dumps(
            {
                "signers": [
                    trust_entry(
                        public_pem, signer_id="demo-throwaway-key", predicate_types=[QUALIFICATION_PREDICATE_TYPE]
                    )
                ]
            },
            indent=2,
        )
        + "\n"
    )

    with SafeTree.open(src) as tree:
        digest = fixture_digest(tree)
    statement = demo_statement(
        digest.digest, "demo-checkpoint", producer=("huggingface_hub", huggingface_hub.__version__)
    )
    attestation = workdir / "checkpoint.intoto.dsse.json"
    attestation.write_bytes(sign_statement(statement, KeySigner.from_pem(key_path)))

    base = options or EngineOptions()
    options = EngineOptions(
        opa_url=base.opa_url,
        opa_token=base.opa_token,
        policy_dir=base.policy_dir,
        trust_file=trust_file,
        timeout_s=base.timeout_s,
    )
    result = intake(src, out, attestations=[attestation], options=options, max_shard_bytes=8000)

    index = json.loads((out / "model.safetensors.index.json").read_text())
    loaded: dict[str, torch.Tensor] = {}
    for shard in sorted(set(index["weight_map"].values())):
        loaded.update(load_file(str(out / shard)))
    if set(loaded) != set(state):
        raise DemoFailed("demo.tensor_names", f"output tensors {sorted(loaded)} differ from input {sorted(state)}")
    for name, tensor in state.items():
        got = loaded[name]
        if (
            got.dtype != tensor.dtype
            or got.shape != tensor.shape
            or got.view(torch.uint8).flatten().tolist() != tensor.view(torch.uint8).flatten().tolist()
        ):
            raise DemoFailed("demo.tensor_bytes", f"tensor {name!r} differs between input and output")
    return DemoResult(
        source=src, attestation=attestation, trust_file=trust_file, intake=result, tensors_compared=len(state)
    )
