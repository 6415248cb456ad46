"""``AttestCallback``: a ``transformers`` ``TrainerCallback`` that attests each ``checkpoint-N/`` it saves.

``on_save`` runs after the ``Trainer`` wrote the checkpoint; the callback waits for every process, then
the main process measures ``output_dir/checkpoint-N/`` exactly as intake will and writes
``checkpoint-N.intoto.dsse.json`` beside it, signed with ``key`` (default ``$CKPTGATE_SIGNING_KEY``)::

    from ckptgate.hooks.transformers import AttestCallback
    trainer = Trainer(..., callbacks=[AttestCallback(key="keys/trainer.pem", builder_id="https://ci.example/trainer")])
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from ckptgate.hooks._attest import attest_saved
from ckptgate.producer.attest import Attested

__all__ = ["AttestCallback"]


def _zero_stage(args: TrainingArguments) -> int | None:
    """The ZeRO stage of a ``Trainer`` run under DeepSpeed (``TrainingArguments(deepspeed=...)``), else ``None``."""
    ds = getattr(args, "hf_deepspeed_config", None)
    stage = ds.get_value("zero_optimization.stage") if ds is not None else None
    return stage if isinstance(stage, int) and not isinstance(stage, bool) else None


class AttestCallback(TrainerCallback):  # type: ignore[misc]
    """Attest every ``checkpoint-N/`` the ``Trainer`` saves (on the main process, after the save)."""

    def __init__(
        self,
        *,
        key: Path | str | None = None,
        builder_id: str | None = None,
        identity_token: str | None = None,
        sigstore_trust_config: Path | str | None = None,
    ) -> None:
        """``key`` (default ``$CKPTGATE_SIGNING_KEY``), or keyless: ``identity_token`` (an OIDC token for the
        audience ``sigstore``) with ``sigstore_trust_config`` (default: the public-good instance)."""
        self.key = key
        self.builder_id = builder_id
        self.identity_token = identity_token
        self.sigstore_trust_config = sigstore_trust_config
        self.started: datetime | None = None
        self.attested: list[Attested] = []
        """What this callback wrote, in order (on the main process)."""

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.started = datetime.now(UTC)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        topology: dict[str, Any] = {"world_size": int(args.world_size)}
        stage = _zero_stage(args)
        if stage is not None:
            topology["zero_stage"] = stage
        done = attest_saved(
            folder,
            key=self.key,
            builder_id=self.builder_id,
            topology=topology,
            training_config=json.loads(args.to_json_string()),
            step=int(state.global_step),
            started=self.started,
            main_process=bool(state.is_world_process_zero),
            identity_token=self.identity_token,
            sigstore_trust_config=self.sigstore_trust_config,
        )
        if done is not None:
            self.attested.append(done)
