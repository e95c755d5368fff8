"""Per-layer loss weights λ_l of the aligned and multi-exit objectives."""

from collections.abc import Sequence
from typing import Literal, Union

import torch
from torch import Tensor

LayerWeights = Union[Literal["linear", "uniform"], list[float]]


def resolve_layer_weights(spec: Union[str, Sequence[float]], num_layers: int, option: str = "layer_weights") -> Tensor:
    """Return λ as a float tensor of length ``L``.

    ``"linear"``: λ_l = 2l / (L(L+1)) for l = 1..L (deeper layers weigh more; sums to 1).
    ``"uniform"``: λ_l = 1/L. A list: used as given after checking it has length ``L`` and only positive entries.
    """
    if isinstance(spec, str):
        if spec == "linear":
            depth = torch.arange(1, num_layers + 1, dtype=torch.float64)
            return (2 * depth / (num_layers * (num_layers + 1))).float()
        if spec == "uniform":
            return torch.full((num_layers,), 1.0 / num_layers)
        raise ValueError(f"`{option}={spec!r}` must be 'linear', 'uniform' or a list of {num_layers} positive numbers.")
    weights = [float(value) for value in spec]
    if len(weights) != num_layers:
        raise ValueError(f"`{option}` has {len(weights)} entries but the model has {num_layers} layers.")
    if any(value <= 0 for value in weights):
        raise ValueError(f"`{option}={weights}` must be positive at every layer.")
    return torch.tensor(weights)
