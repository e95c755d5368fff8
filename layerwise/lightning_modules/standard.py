"""Standard training: cross-entropy at the last layer only."""

from torch import Tensor

from layerwise.features import LOGITS, TARGETS
from layerwise.lightning_modules.base import LayerwiseModule


class Standard(LayerwiseModule):
    """Last-layer cross-entropy, ``CE(head(h_L), y)``: the usual way of training a classifier."""

    def compute_loss(self, outputs: dict[str, Tensor]) -> Tensor:
        return self.cross_entropy(outputs[LOGITS][-1], outputs[TARGETS])
