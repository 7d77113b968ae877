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

from typing import Any

from transformers import TrainerCallback

from memclaims.core.record import Record
from memclaims.watching.session import Watch


class TrainerWatch(TrainerCallback):
    def __init__(self, name: str = "watch") -> None:
        self.name = name
        self.record: Record | None = None
        self._watch: Watch | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, optimizer: Any = None,
                       **kwargs: Any) -> None:
        self._watch = Watch(model, optimizer, name=self.name)
        self._watch.__enter__()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            try:
                watch.__exit__(None, None, None)
            finally:
                self.record = watch._record
