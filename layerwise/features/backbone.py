"""The interface every layer tap implements, so that one set of training strategies serves every model family."""

import abc
from collections.abc import Mapping
from typing import Any, Optional

from torch import Tensor, nn

IGNORE_INDEX = -100


class Backbone(nn.Module, abc.ABC):
    """A model that returns the feature of every layer in one pass, plus its own head (the *shared head*).

    "The output of layer l" is the residual stream after block ``l`` (l = 1..L). Classification backbones pool it
    to one feature per sample: ``forward(inputs)`` gives ``(L, B, d)``. Token-level backbones (causal language
    models, ``token_level = True``) keep every position: ``forward(inputs)`` gives ``(L, B, T, d)`` and every predicted
    position is a sample, its class the next token.

    Attributes:
        num_layers: number of blocks ``L``.
        embed_dim: feature width ``d``.
        num_classes: classifier outputs (the vocabulary size for language models).
        token_level: whether every position is a sample.
    """

    num_layers: int
    embed_dim: int
    num_classes: int
    token_level: bool = False

    def split_batch(self, batch: Any) -> tuple[Any, Optional[Tensor]]:
        """Model inputs and integer targets of a batch: ``(x, y)`` tuples, or dicts whose ``labels`` are the targets.

        Targets are ``(B,)`` for classification and ``(B, T)`` aligned with ``forward``'s positions for token-level
        backbones, ``IGNORE_INDEX`` (-100) where a position predicts nothing. ``None`` when the batch has no labels.
        """
        if isinstance(batch, Mapping):
            inputs = {key: value for key, value in batch.items() if key != "labels"}
            return inputs, batch.get("labels")
        if isinstance(batch, (tuple, list)):
            return batch[0], (batch[1] if len(batch) > 1 else None)
        return batch, None

    @abc.abstractmethod
    def forward(self, inputs: Any) -> Tensor:
        """Every layer's feature in one pass, gradients kept: ``(L, B, d)`` (``(L, B, T, d)`` if token-level)."""

    @abc.abstractmethod
    def head(self, h: Tensor) -> Tensor:
        """The model's own final norm + classifier, applied to features ``(..., d)``."""

    @abc.abstractmethod
    def head_modules(self) -> nn.Module:
        """A fresh, trainable copy of the head, e.g. for a separate exit classifier per layer."""

    def head_parameters(self) -> int:
        """Number of parameters of the shared head."""
        return sum(p.numel() for p in self.head_modules().parameters())
