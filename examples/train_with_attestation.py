"""Train a tiny Llama for two steps with ``transformers.Trainer`` and attest each checkpoint as it is saved.

Runs offline on a CPU in a few seconds: the model comes from a ``LlamaConfig`` and the tokenizer is a
``tokenizers`` WordLevel model built in code.  ``AttestCallback`` signs ``OUT/checkpoint-N.intoto.dsse.json``
beside each ``OUT/checkpoint-N/`` with the key in ``$CKPTGATE_SIGNING_KEY`` (README, "From training job to
published model")::

    CKPTGATE_SIGNING_KEY=trainer.pem python examples/train_with_attestation.py run --builder-id ID
"""

from __future__ import annotations

import argparse

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Trainer, TrainingArguments

from ckptgate.hooks.transformers import AttestCallback

DEEPSPEED = {
    "zero_optimization": {"stage": 2},
    "train_micro_batch_size_per_gpu": "auto",
    "gradient_accumulation_steps": "auto",
    "zero_allow_untested_optimizer": True,
    "steps_per_print": 1000,
}
"""ZeRO-2 for ``--deepspeed``: each ``checkpoint-N/`` then holds DeepSpeed's ``global_stepN/`` partitions too."""

VOCAB = ["<unk>", "<pad>", "<s>", "</s>"] + [f"w{i}" for i in range(28)]


def tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", bos_token="<s>", eos_token="</s>"
    )


class Rows(torch.utils.data.Dataset[dict[str, torch.Tensor]]):
    def __init__(self, tok: PreTrainedTokenizerFast) -> None:
        texts = [" ".join(f"w{(i * 3 + j) % 28}" for j in range(6)) for i in range(8)]
        self.rows = [tok(t)["input_ids"] for t in texts]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.tensor(self.rows[i])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--builder-id", default=None)
    parser.add_argument("--peft", action="store_true", help="Train a PEFT LoRA adapter (the checkpoint holds it).")
    parser.add_argument(
        "--deepspeed", action="store_true", help="Train under DeepSpeed ZeRO-2 (run under torchrun, DS_ACCELERATOR=cpu)."
    )
    args = parser.parse_args()
    torch.manual_seed(1234)
    tok = tokenizer()
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(VOCAB), hidden_size=16, intermediate_size=24, num_hidden_layers=1,
            num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32, tie_word_embeddings=False,
            bos_token_id=2, eos_token_id=3, pad_token_id=1,
        )
    )
    if args.peft:
        from peft import LoraConfig, get_peft_model  # noqa: PLC0415 - only for --peft

        model.name_or_path = model.config._name_or_path = "example/tiny-llama"  # the base model the adapter records
        lora = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM",
                          revision="0123456789abcdef0123456789abcdef01234567")
        model = get_peft_model(model, lora)
    training = TrainingArguments(
        output_dir=args.out, use_cpu=True, max_steps=2, per_device_train_batch_size=2, learning_rate=1e-2,
        save_strategy="steps", save_steps=2, report_to=[], seed=1234, dataloader_num_workers=0,
        deepspeed=DEEPSPEED if args.deepspeed else None,
    )
    trainer = Trainer(
        model=model, args=training, train_dataset=Rows(tok), processing_class=tok,
        callbacks=[AttestCallback(builder_id=args.builder_id)],
    )
    trainer.train()
    if torch.distributed.is_initialized():
        # under torchrun: tear the group down before the interpreter does, as PyTorch asks; a gloo worker thread
        # still holding a finished collective's tensors at exit aborts the process (SIGABRT) now and then
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
