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


class AttestCallback(TrainerCallback):  # type: ignore[misc]
    """Attest every ``checkpoint-N/`` the ``Trainer`` saves (on the main process, after the save)."""

    def __init__(self, *, key: Path | str | None = None, builder_id: str | None = None) -> None:
        self.key = key
        self.builder_id = builder_id
        self.started: datetime | None = None
        self.attested: list[Attested] = []
        """What this callback wrote, in order (on the main process)."""

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.started = datetime.now(UTC)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        done = attest_saved(
            folder,
            key=self.key,
            builder_id=self.builder_id,
            topology={"world_size": int(args.world_size)},
            training_config=json.loads(args.to_json_string()),
            step=int(state.global_step),
            started=self.started,
            main_process=bool(state.is_world_process_zero),
        )
        if done is not None:
            self.attested.append(done)
