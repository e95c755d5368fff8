"""Cross-entropy plus a regulariser that pulls every layer's feature towards the last layer's."""

from typing import Any

import torch.nn.functional as F
from torch import Tensor

from layerwise.features import FEATURES, IGNORE_INDEX, TARGETS, Backbone
from layerwise.lightning_modules.base import LayerwiseModule


class CosRegularized(LayerwiseModule):
    """``CE(head(h_L), y) − β · mean_{l<L} COS(h_l, h_L)``.

    ``COS(h_l, h_L)`` is the sample-wise cosine similarity averaged over the batch (its predicted tokens, for a
    language model); with ``center=True`` (default)
    each layer's features are first centred by their batch mean, the batch counterpart of the globally centred COS
    that the analysis callbacks report.

    Args:
        beta: weight β of the similarity term (>= 0).
        center: centre features by the batch mean before the cosine.
        backbone: the model, as in :class:`LayerwiseModule`.
        kwargs: the other options of :class:`LayerwiseModule` (``optimizer``, ``lr_scheduler``,
            ``scheduler_interval``, ``label_smoothing``, ``chunk_size``).

    Logged keys: ``train/cos_to_last`` (the batch's mean_{l<L} COS(h_l, h_L)), plus those of the base.
    """

    def __init__(
        self,
        backbone: Backbone,
        beta: float = 0.1,
        center: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(backbone, **kwargs)
        if beta < 0:
            raise ValueError(f"`--model.init_args.beta={beta}` must be >= 0.")
        self.beta = beta
        self.center = center

    def cos_to_last(self, features: Tensor) -> Tensor:
        """``mean_{l<L} mean_i cos(h_i^l, h_i^L)`` over the batch, optionally batch-centred."""
        if self.center:
            features = features - features.mean(dim=1, keepdim=True)
        return F.cosine_similarity(features[:-1], features[-1:], dim=-1).mean()

    def compute_loss(self, outputs: dict[str, Tensor]) -> Tensor:
        features, keep = outputs[FEATURES], outputs[TARGETS] != IGNORE_INDEX
        similarity = self.cos_to_last(features if bool(keep.all()) else features[:, keep])
        self.log("train/cos_to_last", similarity)
        return self.last_layer_loss(outputs) - self.beta * similarity
