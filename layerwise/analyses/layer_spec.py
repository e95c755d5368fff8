"""The layers a per-layer analysis is built for (``LayerSpec``), and its results' shapes and scalar names."""

from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor


@dataclass(frozen=True)
class LayerSpec:
    """What the metrics are built for: the selected 1-based layer numbers of a ``depth``-layer model."""

    layer_numbers: list[int]
    depth: int
    dim: int
    num_classes: int
    token_level: bool = False

    @property
    def num_layers(self) -> int:
        """Number of selected layers."""
        return len(self.layer_numbers)

    def key(self, number: int) -> str:
        """The logging suffix of a layer, e.g. ``layer_03``."""
        return f"layer_{number:0{max(2, len(str(self.depth)))}d}"


def shaped(value: Tensor, *shape: int) -> Tensor:
    """``value`` as ``shape``: torchmetrics squeezes one-element results to 0-dim, as a single layer (L = 1) gives."""
    return value.reshape(shape)


def per_layer(values: Sequence[float], spec: LayerSpec, name: str) -> dict[str, float]:
    """Scalars ``name/layer_XX`` of one value per selected layer."""
    return {f"{name}/{spec.key(number)}": float(value) for number, value in zip(spec.layer_numbers, values)}
