"""Aligned training: every layer is trained to be read out by the model's one shared head."""

from typing import Any, Optional

from torch import Tensor

from layerwise.features import Backbone
from layerwise.lightning_modules.base import LayerwiseModule
from layerwise.lightning_modules.weights import (
    ExitSampling,
    LayerWeights,
    resolve_layer_weights,
    sample_exit_layers,
    sampled_exit_weights,
)


class Aligned(LayerwiseModule):
    """Aligned loss ``Σ_l λ_l CE(head(h_l), y)`` with one shared head (Jiang, Zhou & Zhu, 2024).

    Sampled exits (``sampled_exits=k``): when applying the head at every layer is too costly (a language model's
    vocabulary), each step trains the last layer plus ``k`` of the ``L-1`` shallower layers, reweighted by
    ``(L-1)/k`` so that the expected loss equals the aligned loss. The layers are drawn uniformly
    (``exit_sampling="uniform"``, from a generator seeded by the step and ``sampling_seed`` only) or in rotation
    (``"rotating"``); both depend only on the optimizer step, so every rank and every resumed run picks the same.

    Args:
        backbone: see
            :class:`LayerwiseModule`.
        optimizer: see
            :class:`LayerwiseModule`.
        lr_scheduler: see
            :class:`LayerwiseModule`.
        scheduler_interval: see
            :class:`LayerwiseModule`.
        label_smoothing: see
            :class:`LayerwiseModule`.
        chunk_size: see
            :class:`LayerwiseModule`.
        layer_weights: ``"linear"`` (λ_l = 2l/(L(L+1)), default), ``"uniform"`` (1/L) or an explicit list of ``L``
            positive weights (used as given).
        sampled_exits: ``None`` (all layers, default) or the number ``k`` in ``1..L-2`` of shallow layers per step.
        exit_sampling: ``"uniform"`` or ``"rotating"``.
        sampling_seed: seed of the uniform draw.
    """

    def __init__(
        self,
        backbone: Backbone,
        layer_weights: LayerWeights = "linear",
        sampled_exits: Optional[int] = None,
        exit_sampling: ExitSampling = "uniform",
        sampling_seed: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(backbone, **kwargs)
        weights = resolve_layer_weights(layer_weights, backbone.num_layers, "--model.init_args.layer_weights")
        self.register_buffer("layer_weights", weights, persistent=False)
        if sampled_exits is not None and backbone.num_layers < 3:
            raise ValueError(
                f"`--model.init_args.sampled_exits={sampled_exits}`: sampling needs a model of 3 or more layers (this "
                f"one has {backbone.num_layers}, every layer is trained already); leave it unset."
            )
        if sampled_exits is not None and not 1 <= sampled_exits <= backbone.num_layers - 2:
            raise ValueError(
                f"`--model.init_args.sampled_exits={sampled_exits}` must lie in 1..{backbone.num_layers - 2} (L-2) "
                "for this model; leave it unset to train every layer."
            )
        if exit_sampling not in ("uniform", "rotating"):
            raise ValueError(f"`--model.init_args.exit_sampling={exit_sampling!r}` must be 'uniform' or 'rotating'.")
        self.sampled_exits = sampled_exits
        self.exit_sampling = exit_sampling
        self.sampling_seed = sampling_seed

    def exit_layers(self, step: int) -> list[int]:
        """The shallow layers (0-based) that the sampled aligned loss trains at ``step``, besides the last."""
        return sample_exit_layers(self.num_layers, self.sampled_exits, self.exit_sampling, step, self.sampling_seed)

    def weighted_loss(self, outputs: dict[str, Tensor], shallow: Optional[list[int]] = None) -> Tensor:
        """``Σ_l λ_l CE_l`` over every layer, or, given ``shallow`` layers, the reweighted sampled-exit loss."""
        if shallow is None:
            per_layer = self.layer_losses(outputs, range(self.num_layers))
            return (self.layer_weights.to(per_layer.dtype) * per_layer).sum()
        per_layer = self.layer_losses(outputs, [*shallow, self.num_layers - 1])
        weights = sampled_exit_weights(self.layer_weights, shallow, self.sampled_exits)
        return (weights.to(per_layer.dtype) * per_layer).sum()

    def aligned_loss(self, outputs: dict[str, Tensor]) -> Tensor:
        """``Σ_l λ_l CE(head(h_l), y)``, or its unbiased sampled-exit estimate when ``sampled_exits`` is set."""
        if self.sampled_exits is None:
            return self.weighted_loss(outputs)
        step = self.trainer.global_step if self._trainer is not None else 0
        return self.weighted_loss(outputs, self.exit_layers(step))

    def compute_loss(self, outputs: dict[str, Tensor]) -> Tensor:
        return self.aligned_loss(outputs)
