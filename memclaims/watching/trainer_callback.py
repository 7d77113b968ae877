"""``TrainerWatch``: the watch as a ``transformers.TrainerCallback``, one line added to a Trainer script.

    watched = TrainerWatch()
    trainer = Trainer(model=model, args=args, ..., callbacks=[watched])
    trainer.train()
    watched.record                      # the Record of that train()

The watch opens at ``on_train_begin`` (the Trainer's model and optimizer exist then: ``optimizers=(optimizer, None)``
or the one its ``optim`` built) and closes at ``on_train_end``; the phases come from the hooks of
``memclaims.watching.phases``, as they do around a plain loop, so the user's ``compute_loss``, collator and callbacks
run as they are. Each ``train()`` gives a new Record.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from memclaims.core.errors import UsageError
from memclaims.watching.session import CallbackWatch


class TrainerWatch(TrainerCallback, CallbackWatch):
    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       model: nn.Module | None = None, optimizer: torch.optim.Optimizer | None = None,
                       **kwargs: object) -> None:
        if model is None:  # transformers' CallbackHandler passes it on every event
            raise UsageError("TrainerWatch: the Trainer gave on_train_begin no model to watch")
        self._open(model, optimizer)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: object) -> None:
        self._close()
