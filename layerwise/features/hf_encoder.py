"""Layer features of Hugging Face encoders for sequence classification (BERT, RoBERTa, DistilBERT, MiniLM, …)."""

from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import Tensor

from layerwise.features.backbone import Backbone
from layerwise.features.hf import HFBackbone, build_model
from layerwise.features.hooks import block_output, capture_block_call

_OPTION = "--model.init_args.backbone.init_args"


class HFEncoder(HFBackbone, Backbone):
    """A Hugging Face ``AutoModelForSequenceClassification`` that returns the [CLS] feature of every layer.

    "The output of layer l" is the first-token ([CLS]) output of encoder block ``l``. The *shared head* is the
    model's own pooler (where it has one: BERT's dense + tanh) followed by its classifier (RoBERTa: its
    classification head; DistilBERT: pre-classifier + ReLU + classifier), applied to every layer; at the last layer
    it reproduces the model's own logits. Known model types: the encoder families of
    :data:`layerwise.features.paths.FAMILIES`.

    Args:
        model_name_or_path: hub name (``"bert-base-uncased"``) or local folder; ``None`` builds ``model_type`` from
            scratch.
        model_type: e.g. ``"bert"``, with ``config_overrides`` (``num_hidden_layers``, ``hidden_size``,
            ``vocab_size``, …) for a model built offline with random weights.
        pretrained: load the weights (else only the named config).
        num_classes: labels of the task (``num_labels``).
        config_overrides: extra config fields, e.g. ``{"hidden_dropout_prob": 0.0}``.
        activation_checkpointing: recompute every block in the backward pass (transformers'
            ``gradient_checkpointing_enable``).

    Shapes:
        ``forward(inputs)``: dict of ``input_ids``/``attention_mask``/``token_type_ids`` ``(B, T)`` -> ``(L, B, d)``.
    """

    def __init__(
        self,
        model_name_or_path: Optional[str] = None,
        model_type: Optional[str] = None,
        pretrained: bool = True,
        num_classes: int = 2,
        config_overrides: Optional[dict[str, Any]] = None,
        activation_checkpointing: bool = False,
    ) -> None:
        from transformers import AutoModelForSequenceClassification

        model = build_model(
            AutoModelForSequenceClassification,
            model_name_or_path,
            model_type,
            pretrained,
            config_overrides,
            _OPTION,
            num_labels=num_classes,
        )
        super().__init__(model, f"{_OPTION}.model_type", activation_checkpointing)
        if self.paths.pooling != "cls":
            raise ValueError(
                f"`{_OPTION}.model_type`: HFEncoder reads the first ([CLS]) token, but {type(model).__name__} "
                f"classifies from its {self.paths.pooling!r} token; use an encoder (bert, roberta, distilbert, ...)."
            )
        self.num_classes = num_classes

    @property
    def vocab_size(self) -> int:
        """Rows of the model's token embedding."""
        return int(self.model.config.vocab_size)

    def forward(self, inputs: dict[str, Tensor]) -> Tensor:
        """The [CLS] output of every block: ``(L, B, d)``; one pass of the model, gradients kept."""
        outputs = self.run_collecting(lambda: self.model(**inputs))
        return torch.stack([tokens[:, 0] for tokens in outputs])

    def embed(self, inputs: dict[str, Tensor]) -> tuple[Tensor, "BlockArguments"]:
        """The tokens entering block 1 and the arguments the model's own encoder calls its blocks with.

        The model's own forward runs up to the entry of block 1 (embeddings, attention-mask construction) and is
        stopped there by a forward pre-hook, which keeps exactly what the model hands its blocks: the embedded
        tokens and the attention mask in the format of the configured attention implementation (an additive float
        mask for ``eager``, a boolean one or ``None`` without padding for ``sdpa``, in transformers 5.x; the
        extended mask of 4.x). Nothing of the mask logic is re-implemented, so block-by-block execution equals
        :meth:`forward` for every attention implementation and transformers version whose encoder hands every
        block the same extra arguments (true for BERT, RoBERTa and DistilBERT without head masks or caches).
        """
        args, kwargs = capture_block_call(self.blocks[0], lambda: self.model(**inputs))
        if args:
            hidden, arguments = args[0], BlockArguments(args[1:], kwargs)
        else:
            hidden, arguments = kwargs.pop("hidden_states"), BlockArguments((), kwargs, hidden_keyword=True)
        arguments.batch_size = hidden.shape[0]
        arguments.check()
        return hidden, arguments

    def run_block(self, index: int, hidden: Tensor, context: "BlockArguments") -> Tensor:
        """Block ``index`` (0-based), called as the model's own encoder calls it."""
        block = self.blocks[index]
        if context.hidden_keyword:
            return block_output(block(*context.args, hidden_states=hidden, **context.kwargs))
        return block_output(block(hidden, *context.args, **context.kwargs))

    def pool(self, hidden: Tensor, context: "BlockArguments") -> Tensor:
        """The first-token ([CLS]) feature of a block's output, as :meth:`forward` takes it."""
        return hidden[:, 0]

    def select(self, context: "BlockArguments", rows: Tensor) -> "BlockArguments":
        """The block arguments of the samples ``rows``."""
        return context.select(rows)


@dataclass
class BlockArguments:
    """What an encoder block is called with besides the hidden states, captured from the model's own forward.

    Per-sample tensors (those whose first dimension is the batch size, e.g. the ``(B, 1, T, T)`` attention mask)
    are cut to the remaining rows by :meth:`select`; broadcast tensors (first dimension 1), ``None`` and Python
    scalars are kept as they are.
    """

    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    hidden_keyword: bool = False
    batch_size: int = field(default=0)

    def check(self) -> None:
        """Raise a TypeError for an argument that :meth:`select` could not cut (e.g. flex attention's BlockMask)."""
        for name, value in self._named():
            if value is not None and not isinstance(value, (Tensor, bool, int, float, str)):
                raise TypeError(
                    f"Block-by-block execution cannot select rows of the block argument {name} of type "
                    f"{type(value).__name__}; use attn_implementation 'eager' or 'sdpa' "
                    f"(`{_OPTION}.config_overrides`)."
                )

    def select(self, rows: Tensor) -> "BlockArguments":
        """The arguments of the samples ``rows`` (a 1-D index tensor)."""

        def take(value: Any) -> Any:
            if isinstance(value, Tensor) and value.ndim > 0 and value.shape[0] == self.batch_size:
                return value.index_select(0, rows.to(value.device))
            return value

        args = tuple(take(value) for value in self.args)
        kwargs = {key: take(value) for key, value in self.kwargs.items()}
        return BlockArguments(args, kwargs, self.hidden_keyword, int(rows.numel()))

    def _named(self) -> list[tuple[str, Any]]:
        return [(f"#{i + 1}", value) for i, value in enumerate(self.args)] + list(self.kwargs.items())
