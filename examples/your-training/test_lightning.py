"""A LightningModule with its own training_step on Lightning's Trainer, with one callback line."""

import lightning as L
import torch
from torch import nn

from memclaims.watching import LightningWatch


class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10))

    def training_step(self, batch, batch_idx):
        inputs, targets = batch
        return nn.functional.cross_entropy(self.net(inputs), targets)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def test_lightning_training_memory(memclaims_watch):
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(128, 256), torch.randint(0, 10, (128,)))
    watched = LightningWatch()  # the one added line, and callbacks=[watched]
    trainer = L.Trainer(accelerator="cpu", max_steps=4, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[watched])
    trainer.fit(Classifier(), torch.utils.data.DataLoader(data, batch_size=32))
    memclaims_watch.judge(watched.record)
