"""``LightningWatch``: the watch as a Lightning ``Callback`` for Lightning's Trainer, one line added to a script.

    watched = LightningWatch()
    trainer = L.Trainer(..., callbacks=[watched])
    trainer.fit(module, loader)
    watched.record

The watch opens at ``on_train_start`` (the module and its optimizers are set up then) and closes at ``on_train_end``:
the user's ``training_step``, ``configure_optimizers`` and hooks run as they are; automatic optimization's closure
(forward and backward inside ``optimizer.step``) is told apart by ``memclaims.watching.phases``. With Fabric, the
watch itself goes around the loop, over what ``fabric.setup`` returned, as with Accelerate's ``prepare``.
"""

from __future__ import annotations

from lightning.pytorch import Callback, LightningModule, Trainer

from memclaims.watching.session import CallbackWatch


class LightningWatch(Callback, CallbackWatch):
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._open(pl_module, list(trainer.optimizers))

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._close()
