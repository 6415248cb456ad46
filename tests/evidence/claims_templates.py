"""Template-generated sentences for the claims lint, with the label each template gives (never the lint's).

Systems, platforms, quantifiers, threats and hedges are substituted into over-claim templates
(``expect``: an error) and bounded templates (``expect``: None).  It measures consistency of the claim
model across substitutions, not independence: the templates were written by the people who wrote the
model.  Judged against ``data/claims_matrix.json``.
"""

from __future__ import annotations

from itertools import product

AGENTS = ("ckptgate", "The gate", "Intake", "ckptgate's consolidator")
VERBS = ("supports", "reads", "handles", "consolidates", "works with", "is compatible with", "accepts")
BASES = ("support", "read", "handle", "consolidate", "work with", "accept")
UNSUPPORTED = ("ZeRO-1", "FSDP2", "Megatron Bridge", "NeMo", "GGUF", "ONNX", "JAX", "TensorFlow", "Orbax", "Keras",
               "TorchScript", "Ray Train", "Colossal-AI", "vLLM")
SUPPORTED = ("ZeRO-3", "ZeRO-2", "DeepSpeed Universal", "PEFT LoRA", "HF sharded safetensors")
PLATFORMS = ("macOS", "Windows", "FreeBSD", "Kubernetes", "ARM64 Macs", "H100 GPUs", "CUDA 12", "AMD GPUs",
             "Slurm clusters", "Lustre", "NFS", "S3 buckets", "64 nodes", "TPUs")
QUALIFIED = ("is qualified on", "is tested on", "has been validated on", "is proven on", "runs unchanged on")
DIMENSIONS = ("any tensor-parallel size", "any world size", "every topology", "all versions", "any pipeline depth")
QUANTS = ("Any", "Every")
THREATS = ("A malicious pickle", "A checkpoint", "The loaded model", "Untrusted code", "A hostile payload")
CANNOTS = ("cannot", "can never", "has no way to", "will never")
ACTIONS = ("read files on the host", "reach the network", "run code on the host", "escape the worker",
           "harm the host", "open your SSH keys")
PROVERS = ("The receipt", "A valid signature", "The attestation", "A matching checksum")
CONCLUSIONS = ("the model is safe", "the model has no backdoor", "the weights are free of malware",
               "the checkpoint is harmless", "the file is trustworthy")
FEATURES = ("checks", "verifies", "detects", "scans for")
UNLISTED = ("certificate revocation", "malware", "model licenses", "backdoors", "leaked secrets",
            "known CVEs")
CONTROLS = ("The worker", "A signature", "Containment", "ckptgate", "The static reader")
LIMITS = ("prove that a checkpoint is safe", "make a pickle harmless", "stop a kernel exploit",
          "guarantee that a load is benign")
CONSUMERS = ("Our trainer", "My pipeline", "Our cluster scheduler", "Your training script")


def over_claims() -> list[tuple[str, str]]:
    out = []
    for a, v, s in product(AGENTS, VERBS, UNSUPPORTED):
        out.append((f"{a} {v} {s} checkpoints.", "claims_support_not_in_matrix"))
    for a, q, p in product(AGENTS, QUALIFIED, PLATFORMS):
        out.append((f"{a} {q} {p}.", "claims_support_not_in_matrix"))
    for a, v, s, d in product(AGENTS[:2], VERBS[:4], SUPPORTED, DIMENSIONS):
        out.append((f"{a} {v} {s} checkpoints at {d}.", "claims_support_not_in_matrix"))
    for q, s in product(QUANTS, SUPPORTED):
        out.append((f"{q} {s} checkpoint is consolidated by ckptgate.", "claims_support_not_in_matrix"))
        out.append((f"{s} checkpoints are fully supported, at {q.lower()} version.", "claims_support_not_in_matrix"))
    for t, c, act in product(THREATS, CANNOTS, ACTIONS):
        out.append((f"Inside the worker, {t[0].lower() + t[1:]} {c} {act}.", "claims_containment_as_proof"))
    for p, c in product(PROVERS, CONCLUSIONS):
        out.append((f"{p} proves that {c}.", "claims_containment_as_proof"))
    for a, f, u in product(AGENTS, FEATURES, UNLISTED):
        out.append((f"{a} {f} {u}.", "claims_unlisted_capability"))
    for u in UNLISTED:
        out.append((f"Bundles are checked for {u}.", "claims_unlisted_capability"))
    return out


def bounded() -> list[str]:
    out = []
    for a, b, s in product(AGENTS, BASES, UNSUPPORTED):
        out.append(f"{a} does not {b} {s} checkpoints.")
    for a, p in product(AGENTS, PLATFORMS):
        out.append(f"{a} has not been qualified on {p}.")
        out.append(f"{a} does not claim to run on {p}.")
    for a, v, s in product(AGENTS, VERBS[:4], SUPPORTED):
        out.append(f"{a} {v} {s} checkpoints at the versions the support matrix records.")
    for c, lim in product(CONTROLS, LIMITS):
        out.append(f"{c} cannot {lim}.")
    for p, c in product(PROVERS, CONCLUSIONS):
        out.append(f"{p} does not prove that {c}.")
    for a, u in product(AGENTS, UNLISTED):
        out.append(f"{a} does not check for {u}.")
    for who, p in product(CONSUMERS, PLATFORMS):
        out.append(f"{who} supports {p}.")
    return out


def sentences() -> list[dict[str, str | None]]:
    return [{"text": t, "expect": c} for t, c in over_claims()] + [{"text": t, "expect": None} for t in bounded()]
