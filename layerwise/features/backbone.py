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

    # -- block-by-block execution (optional; early exit needs it) ------------------------------------------------
    # Together the four methods below reproduce ``forward`` one block at a time, so that a caller can drop rows
    # between blocks: for every layer l, ``pool(hidden_l, context)`` equals ``forward(inputs)[l - 1]`` where
    # ``hidden_l`` is the output of ``run_block(l - 1, ...)`` applied to the result of block l - 1 (``embed`` for
    # l = 1). Backbones that cannot run block by block leave them unimplemented (NotImplementedError).

    def embed(self, inputs: Any) -> tuple[Tensor, Any]:
        """The tokens entering block 1, ``(B, T, d)``, and the ``context`` the blocks and the pooling need.

        ``context`` is whatever every block is called with besides the hidden states (e.g. the attention mask in
        the format the model's blocks expect) and whatever :meth:`pool` needs; ``None`` when there is nothing.
        """
        raise self._no_blocks("embed")

    def run_block(self, index: int, hidden: Tensor, context: Any) -> Tensor:
        """Block ``index`` (0-based) applied to ``hidden`` ``(B, T, d)``: the residual stream after block index+1."""
        raise self._no_blocks("run_block")

    def pool(self, hidden: Tensor, context: Any) -> Tensor:
        """The per-sample feature ``(B, d)`` of a block's output, the same that :meth:`forward` returns for it."""
        raise self._no_blocks("pool")

    def select(self, context: Any, rows: Tensor) -> Any:
        """The context of the samples ``rows`` (1-D index tensor into the batch), in that order."""
        raise self._no_blocks("select")

    def _no_blocks(self, method: str) -> NotImplementedError:
        return NotImplementedError(
            f"{type(self).__name__} does not implement `{method}`: block-by-block execution (embed, run_block, pool, "
            "select) is needed for early exit and is implemented by TimmViT and HFEncoder."
        )

    def head_parameters(self) -> int:
        """Number of parameters of the shared head."""
        return sum(p.numel() for p in self.head_modules().parameters())
