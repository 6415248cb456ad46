"""Hooks where checkpoints are written: each attests a checkpoint once it is complete, on one process.

* :class:`ckptgate.hooks.transformers.AttestCallback`: a ``transformers`` ``TrainerCallback`` that attests
  every ``checkpoint-N/`` the ``Trainer`` saves;
* :func:`after_dcp_save`: after ``torch.distributed.checkpoint.save`` (torchtitan-style loops, FSDP2);
* :func:`after_accelerate_save`: after ``Accelerator.save_state``;
* :func:`after_deepspeed_save`: after ``DeepSpeedEngine.save_checkpoint``;
* Megatron: call :func:`after_dcp_save` on the iteration folder after ``save_checkpoint`` (docs/attestations.md).

Every process calls the hook (it waits for the others where a process group exists); only the main
process measures and signs, so the statement covers the files of every rank.
"""

from ckptgate.hooks._attest import after_accelerate_save, after_dcp_save, after_deepspeed_save, attest_saved

__all__ = ["after_accelerate_save", "after_dcp_save", "after_deepspeed_save", "attest_saved"]
