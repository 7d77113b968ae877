"""Small user models built from the ``nn`` modules people use, each a workload through ``define()``
only (the sim gets nothing else): for the sim-versus-cpu tests of ``test_sim_user_modules``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from memclaims.workloads.types import Workload
from memclaims.workloads.user import define

WIDTH, SEQ, VOCAB, CLASSES = 32, 12, 50, 3


def _tokens(size: int, seed: int) -> list[tuple[torch.Tensor, int]]:
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randint(1, VOCAB, (size, SEQ), generator=generator)
    rows[:, -3:] = 0  # padding (index 0)
    return [(rows[i].clone(), i % CLASSES) for i in range(size)]


def _images(size: int, seed: int, shape: tuple[int, ...]) -> list[tuple[torch.Tensor, int]]:
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(*shape, generator=generator), i % CLASSES) for i in range(size)]


class EncoderDecoder(nn.Module):
    """``nn.Transformer`` (its own ``_reset_parameters``, deep-copied layers) over padded tokens."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH, padding_idx=0)
        self.core = nn.Transformer(WIDTH, nhead=4, num_encoder_layers=2, num_decoder_layers=2, dim_feedforward=64,
                                   dropout=0.0, batch_first=True)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> Any:
        h = self.embed(x)
        return self.head(self.core(h, h, src_key_padding_mask=x == 0).mean(1))


class EncoderDecoderStacks(nn.Module):
    """``TransformerEncoder`` / ``TransformerDecoder`` built from layers, norm_first, a causal mask."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH, padding_idx=0)
        encoder = nn.TransformerEncoderLayer(WIDTH, 4, 64, dropout=0.0, batch_first=True, norm_first=True)
        decoder = nn.TransformerDecoderLayer(WIDTH, 4, 64, dropout=0.0, batch_first=True, activation="gelu")
        self.encoder = nn.TransformerEncoder(encoder, 2, enable_nested_tensor=False)
        self.decoder = nn.TransformerDecoder(decoder, 2, norm=nn.LayerNorm(WIDTH))
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> Any:
        h = self.embed(x)
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1])
        return self.head(self.decoder(h, self.encoder(h), tgt_mask=mask, tgt_is_causal=True).mean(1))


class Attention(nn.Module):
    """``nn.MultiheadAttention`` on both its paths: the SDPA one (need_weights=False) and the one
    that returns the averaged weights (explicit scores and softmax); kdim/vdim of their own."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH, padding_idx=0)
        self.fused = nn.MultiheadAttention(WIDTH, 4, batch_first=True)
        self.weighted = nn.MultiheadAttention(WIDTH, 4, kdim=16, vdim=24, batch_first=True, bias=False)
        self.k, self.v = nn.Linear(WIDTH, 16), nn.Linear(WIDTH, 24)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> Any:
        h = self.embed(x)
        a, _ = self.fused(h, h, h, key_padding_mask=x == 0, need_weights=False)
        b, weights = self.weighted(a, self.k(a), self.v(a), need_weights=True)
        return self.head((b + a).mean(1) + weights.mean(1).sum(-1, keepdim=True))


class Recurrent(nn.Module):
    """``nn.LSTM`` (two layers, bidirectional) and ``nn.GRU`` over embeddings."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH, padding_idx=0)
        self.lstm = nn.LSTM(WIDTH, WIDTH, num_layers=2, batch_first=True, bidirectional=True)
        self.gru = nn.GRU(2 * WIDTH, WIDTH, batch_first=True)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> Any:
        out, _ = self.lstm(self.embed(x))
        out, _ = self.gru(out)
        return self.head(out[:, -1])


class Convolutions(nn.Module):
    """Convolutions of every dimension and kind, and the norms: batch, group, instance, layer, RMS."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv1d(4, 8, 3, padding=1), nn.BatchNorm1d(8), nn.GELU())
        self.conv2 = nn.Sequential(nn.Conv2d(4, 8, 3, stride=2, padding=1, groups=2), nn.GroupNorm(2, 8), nn.SiLU(),
                                   nn.ConvTranspose2d(8, 8, 2, stride=2), nn.BatchNorm2d(8), nn.ReLU(),
                                   nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.InstanceNorm2d(8, affine=True))
        self.conv3 = nn.Sequential(nn.Conv3d(1, 4, 3, padding=1), nn.BatchNorm3d(4), nn.LocalResponseNorm(2))
        self.norms = nn.Sequential(nn.LayerNorm(8 + 8 + 4), nn.RMSNorm(8 + 8 + 4))
        self.head = nn.Linear(8 + 8 + 4, CLASSES)

    def forward(self, x: torch.Tensor) -> Any:
        one = self.conv1(x.flatten(2)).mean(-1)  # (N, 4, 64)
        two = self.conv2(x).mean((-2, -1))
        three = self.conv3(x.unsqueeze(1)).mean((-3, -2, -1))
        return self.head(self.norms(torch.cat([one, two, three], 1)))


# name -> (model class, examples(size, seed), the block class FSDP and checkpointing wrap)
ZOO: dict[str, tuple[type[nn.Module], Callable[[int, int], list[tuple[torch.Tensor, int]]], type[nn.Module]]] = {
    "zoo-transformer": (EncoderDecoder, _tokens, nn.TransformerEncoderLayer),
    "zoo-stacks": (EncoderDecoderStacks, _tokens, nn.TransformerDecoderLayer),
    "zoo-attention": (Attention, _tokens, nn.MultiheadAttention),
    "zoo-recurrent": (Recurrent, _tokens, nn.LSTM),
    "zoo-convolutions": (Convolutions, lambda size, seed: _images(size, seed, (4, 8, 8)), nn.Sequential),
}


def workload(name: str) -> Workload:
    model, examples, block = ZOO[name]
    return define(name, num_classes=CLASSES, block_class=block, smoke_batch_size=8, article_batch_size=8,
                  build_model=lambda scale: model(), train_data=lambda scale: examples(32, 1),
                  test_data=lambda scale: examples(16, 2))
