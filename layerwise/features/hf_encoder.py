"""Layer features of Hugging Face encoders for sequence classification (BERT, RoBERTa, DistilBERT, MiniLM, …)."""

from typing import Any, Optional

import torch
from torch import Tensor

from layerwise.features.backbone import Backbone
from layerwise.features.hf import ENCODER_PATHS, HFBackbone, build_model

_OPTION = "--model.init_args.backbone.init_args"


class HFEncoder(HFBackbone, Backbone):
    """A Hugging Face ``AutoModelForSequenceClassification`` that returns the [CLS] feature of every layer.

    "The output of layer l" is the first-token ([CLS]) output of encoder block ``l``. The *shared head* is the
    model's own pooler (where it has one: BERT's dense + tanh) followed by its classifier (RoBERTa: its
    classification head; DistilBERT: pre-classifier + ReLU + classifier), applied to every layer; at the last layer
    it reproduces the model's own logits. Known model types: see ``ENCODER_PATHS`` in :mod:`layerwise.features.hf`.

    Args:
        model_name_or_path: hub name (``"bert-base-uncased"``) or local folder; ``None`` builds ``model_type`` from
            scratch.
        model_type: e.g. ``"bert"``, with ``config_overrides`` (``num_hidden_layers``, ``hidden_size``,
            ``vocab_size``, …) for a model built offline with random weights.
        pretrained: load the weights (else only the named config).
        num_classes: labels of the task (``num_labels``).
        config_overrides: extra config fields, e.g. ``{"hidden_dropout_prob": 0.0}``.

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
        super().__init__(model, ENCODER_PATHS, f"{_OPTION}.model_type")
        self.num_classes = num_classes

    @property
    def vocab_size(self) -> int:
        """Rows of the model's token embedding."""
        return int(self.model.config.vocab_size)

    def forward(self, inputs: dict[str, Tensor]) -> Tensor:
        """The [CLS] output of every block: ``(L, B, d)``; one pass of the model, gradients kept."""
        outputs = self.run_collecting(lambda: self.model(**inputs))
        return torch.stack([tokens[:, 0] for tokens in outputs])
