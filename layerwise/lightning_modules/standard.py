"""Standard training: cross-entropy at the last layer only."""

from torch import Tensor

from layerwise.lightning_modules.base import LayerwiseModule


class Standard(LayerwiseModule):
    """Last-layer cross-entropy, ``CE(head(h_L), y)``: the usual way of training a classifier or a language model."""

    def compute_loss(self, outputs: dict[str, Tensor]) -> Tensor:
        return self.last_layer_loss(outputs)
