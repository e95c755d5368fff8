"""Per-layer loss weights λ_l of the aligned and multi-exit objectives."""

import math
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
    if not all(math.isfinite(value) and value > 0 for value in weights):  # NaN fails `value > 0`, inf isfinite
        raise ValueError(f"`{option}={weights}` must be finite and positive at every layer.")
    return torch.tensor(weights)


ExitSampling = Literal["uniform", "rotating"]


def sample_exit_layers(num_layers: int, k: int, mode: str, step: int, seed: int = 0) -> list[int]:
    """The ``k`` shallow layers (0-based, among ``0..L-2``) trained at ``step`` besides the last one.

    ``"uniform"``: a uniformly random k-subset drawn from a generator seeded by ``(seed, step)`` alone, so every
    rank, and a resumed run, draws the same layers without communicating. ``"rotating"``: the window of ``k``
    consecutive layers starting at ``step·k mod (L-1)``, so every ``L-1`` steps each layer is trained ``k`` times.
    Either way every shallow layer is picked with probability ``k/(L-1)``.
    """
    shallow = num_layers - 1
    if mode == "uniform":
        generator = torch.Generator().manual_seed(seed * 1_000_003 + step)
        return sorted(torch.randperm(shallow, generator=generator)[:k].tolist())
    if mode == "rotating":
        start = (step * k) % shallow
        return sorted((start + offset) % shallow for offset in range(k))
    raise ValueError(f"`--model.init_args.exit_sampling={mode!r}` must be 'uniform' or 'rotating'.")


def sampled_exit_weights(weights: Tensor, layers: Sequence[int], k: int) -> Tensor:
    """Weights of the last layer plus the sampled ones: ``λ_L`` and ``λ_l · (L-1)/k``, unbiased for the aligned loss.

    With every shallow layer sampled with probability ``k/(L-1)``, ``E[Σ_sampled λ_l (L-1)/k · CE_l] + λ_L CE_L =
    Σ_l λ_l CE_l``.
    """
    shallow = weights.numel() - 1
    picked = weights[list(layers)] * (shallow / k)
    return torch.cat([picked, weights[-1:]])
