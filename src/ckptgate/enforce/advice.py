"""The next step for each deny reason the policies give (``_reason("...")`` in ``policies/``): a
refusal's advice is the advice of the reason that decided it (:func:`ckptgate.enforce.gate.refusal`),
so that it names the command, option or file to reach for, not only the class of refusal.

``SRC`` stands for the checkpoint directory the command was given.  Informational reasons
(:data:`INFORMATIONAL`) never decide a refusal and have no entry; ``tests/test_advice.py`` checks
that every other code the Rego can give has one, and that it names a command, option or file.
"""

from __future__ import annotations

__all__ = ["INFORMATIONAL", "REASON_ADVICE"]

#: Reasons that explain an allow or a choice, never a refusal.
INFORMATIONAL = frozenset(
    {
        "attestation_trusted",
        "attestation_not_used",
        "plane_selected",
        "finding_excepted",
        "training_state_selected",
        "resume_state_excluded",
        "containment_optional_control_absent",
        "hf_mapping_declared_not_measured",
        "hf_mapping_args_agreed",
        "hf_mapping_companion_not_published",
    }
)

_EXPLAIN = "`ckptgate explain SRC` (with the same options) lists the accepted predicate types and signers"

REASON_ADVICE: dict[str, str] = {
    "attestation_missing": f"Offer an attestation of exactly this checkpoint with --attestation FILE "
    f"(`ckptgate attest sign` makes one with a key the trust data names); {_EXPLAIN}.",
    "attestation_rejected": "`ckptgate attest verify FILE --digest sha256:...` (the digest `ckptgate inspect SRC "
    "--digest` measures) shows why the attestation failed; one made for other bytes cannot be reused.",
    "attestation_adapter_mismatch": "Offer an attestation that qualifies the adapter this format needs "
    "(`ckptgate qualify` runs it; `ckptgate explain SRC` names the adapter) with --attestation FILE.",
    "attestation_result_not_passed": "Run `ckptgate qualify` for this adapter again and offer the attestation "
    "of a passing result with --attestation FILE.",
    "attestation_wrong_predicate_type": f"Offer an attestation of an accepted predicate type with --attestation "
    f"FILE; {_EXPLAIN}.",
    "no_supported_attestation": "Qualify the adapter at that commit (`ckptgate qualify`) and offer its attestation "
    "with --attestation FILE, or leave --candidate-commit out.",
    "producer_release_missing": "Offer an attestation that states the producer and its release (--attestation "
    "FILE; `ckptgate attest sign --statement FILE` signs a statement that names them).",
    "producer_release_unqualified": "Save the checkpoint with a release that ckptgate/config/qualified/data.json "
    "lists, or qualify this release with `ckptgate qualify` in a reviewed change to that file.",
    "topology_unqualified": "Save the checkpoint with a topology ckptgate/config/qualified/data.json lists, or "
    "qualify this one with `ckptgate qualify` in a reviewed change; `ckptgate explain SRC` names both.",
    "containment_control_missing": "The plane needs a control this host did not confirm: `ckptgate explain SRC "
    "--json` shows what the preflight observed; take it in on a Linux host that allows unprivileged user "
    "namespaces and seccomp, or have the producer save safetensors (no framework load).",
    "containment_not_preflighted": "Take the checkpoint in with `ckptgate intake SRC --out DST`, which preflights "
    "the containment profile on this host before a framework load is allowed.",
    "format_not_consolidatable": "`ckptgate inspect SRC` names the format it recognised; have the producer save "
    "one ckptgate consolidates (safetensors, DCP, DeepSpeed ZeRO, Megatron dist), or take the files in as they are "
    "elsewhere.",
    "format_unknown": "`ckptgate inspect SRC` shows what was recognised: name the checkpoint directory itself "
    "(not its parent), or have the producer save a format ckptgate knows.",
    "loaders_missing": "`ckptgate inspect SRC` lists the files and their kinds: the directory holds nothing a "
    "loader reads; name the checkpoint directory itself.",
    "unknown_loader": "That loader has no risk class in ckptgate/config/loaders/data.json: add one in a reviewed "
    "change, or have the producer save safetensors.",
    "loader_not_consolidatable": "`ckptgate inspect SRC` names the loaders this checkpoint needs; the target asked "
    "for cannot be written from them: leave the target to its default.",
    "inspection_not_clean": "`ckptgate inspect SRC` lists each finding with its file and evidence; obtain the "
    "checkpoint again from its producer if it should have been clean.",
    "pickle_outside_allowlist": "`ckptgate inspect SRC --json` names each pickle's globals and calls; a checkpoint "
    "its producer wrote stays inside the allowlist: obtain it again, or have it saved as safetensors.",
    "pickle_global_not_allowlisted": "`ckptgate inspect SRC --json` names the global and its file; obtain the "
    "checkpoint again from its producer, or have it saved as safetensors.",
    "pickle_report_missing": "The policy input lacks inspection.pickles: let ckptgate build it (`ckptgate decide "
    "SRC --json` prints the document it sends).",
    "input_malformed": "The policy input does not have the shape ckptgate builds: `ckptgate decide SRC --json` "
    "prints the document it sends; a caller of the policy must send that shape.",
    "request_invalid": "The request part of the policy input is not one ckptgate builds: `ckptgate decide SRC "
    "--json` prints it; take the checkpoint in with `ckptgate intake`.",
    "hf_mapping_not_qualified": "Leave --hf-config out, or use a mapping row that hf_mapping.qualified lists in "
    "ckptgate/config/intake/data.json.",
    "hf_mapping_provenance_unknown": "Offer the producer's attestation that states the megatron-core release and "
    "topology with --attestation FILE, or leave --hf-config out.",
    "hf_config_contradicts_attestation": "Declare with --hf-config the config the job trained against (the "
    "training provenance records its manifest sha256: `ckptgate attest show FILE`), or offer the provenance of "
    "this config.",
    "hf_config_not_attested": "Offer training provenance made with `ckptgate attest checkpoint --hf-config DIR` "
    "for this config, or set hf_mapping.require_attested_config to false in a policy-data overlay.",
    "hf_mapping_topology_mismatch": "Offer the attestation made for this checkpoint's own tensor-parallel layout "
    "(`ckptgate inspect SRC --json` shows it) with --attestation FILE.",
    "resume_state_global_not_allowlisted": "`ckptgate inspect SRC --json` names the file and the global, which the "
    "trainer does not write: obtain the checkpoint-N folder again from the trainer.",
    "selection_matches_nothing": "Name one of the top-level keys the message lists with --select.",
    "selection_not_applicable": "Leave --select out: it selects a subtree of a training-state tree only.",
    "training_producer_not_gated": "Attest with the producer release the job ran (`ckptgate attest checkpoint SRC "
    "--producer NAME=VERSION`), or qualify that release first (`ckptgate qualify --adapter ADAPTER`); `ckptgate "
    "explain SRC --attestation FILE` names the qualified releases.",
    "training_state_ambiguous": "Name the subtree to take in with --select (the message lists the candidates).",
    "training_state_layout_unknown": "`ckptgate inspect SRC --json` shows the tree's layout; name the subtree to "
    "take in with --select.",
}
