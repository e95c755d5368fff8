"""Early exit that saves compute: batched inference with the single shared head, one block at a time.

The analysis (:class:`~layerwise.callbacks.LogitLensMonitor`) *measures* what early exit would give: it reads every
layer and reports the paper's layer-count speedup. This module *does* it: the batch runs block by block through
:meth:`~layerwise.features.Backbone.run_block`; after every block the model's own head reads the remaining samples,
those that meet the exit criterion leave the batch with that layer's prediction, and only the others pass through
the next block. Exited samples cost nothing afterwards, so the wall time falls with the number of rows the blocks
process, which is what the layer-count speedup counts.

Exit criteria (exactly one), evaluated on the shared head's logits ``z`` at layer l = 1..L, in float64:

- ``threshold=τ``: exit at the first l with ``max softmax(z) ≥ τ`` (the analysis' definition,
  :func:`layerwise.metrics.functional._early_exit_update`).
- ``entropy=e``: exit at the first l with ``H(softmax(z)) = -Σ_c p_c log p_c ≤ e`` (natural log, nats).
- ``patience=p``: exit once the top-1 prediction has stayed the same for ``p`` consecutive layers (PABEE, Zhou et
  al. 2020): a counter is 0 at layer 1 (nothing to compare with), grows by one at every layer whose prediction
  equals the previous layer's and falls back to 0 when it differs; the sample exits at the first layer whose
  counter reaches ``p``. So it exits at layer l when layers ``l - p, …, l`` all predict the same class: at layer
  ``p + 1`` at the earliest, and ``p = 0`` exits everyone at layer 1.

A sample that never meets the criterion exits at layer L. The layer-count speedup of N samples with exit layers
``e_i`` is ``L·N / Σ_i e_i = Σ_l L·m_l / Σ_l l·m_l`` (``m_l`` samples exit at l); :func:`measure_speedup` puts the
measured wall-clock speedup next to it.
"""

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional, Union

import torch
from torch import Tensor

from layerwise.engines.readout import chunked_readout
from layerwise.features import Backbone
from layerwise.metrics.functional import Readout

# The keys of an early-exit ``predict_step``'s dict, which EarlyExitPredictionWriter reads.
PREDICTIONS = "predictions"
EXIT_LAYERS = "exit_layers"
TARGETS = "targets"
CRITERIA = ("threshold", "entropy", "patience")


@dataclass
class EarlyExitResult:
    """Predictions and exit layers of early-exit inference, with its speedups.

    Attributes:
        predictions: ``(N,)`` the shared head's argmax at each sample's exit layer.
        exit_layers: ``(N,)`` 1-based layer at which each sample left.
        num_layers: ``L``.
        criterion: the criterion used, e.g. ``{"threshold": 0.9}``.
        layer_count_speedup: ``L·N / Σ_i exit_layers_i`` (the paper's ``Σ L·m_l / Σ l·m_l``); NaN for N = 0.
        measured_speedup: wall time of the full model / wall time of early exit on the same inputs
            (:func:`measure_speedup` only, else ``None``).
        full_seconds, early_exit_seconds: the two wall times behind ``measured_speedup``.
    """

    predictions: Tensor
    exit_layers: Tensor
    num_layers: int
    criterion: dict[str, Union[float, int]]
    layer_count_speedup: float = field(init=False)
    measured_speedup: Optional[float] = None
    full_seconds: Optional[float] = None
    early_exit_seconds: Optional[float] = None

    def __post_init__(self) -> None:
        self.layer_count_speedup = layer_count_speedup(self.exit_layers, self.num_layers)

    @property
    def exit_counts(self) -> Tensor:
        """``(L,)`` number of samples that exit at each layer (``m_l``)."""
        return torch.bincount(self.exit_layers.cpu() - 1, minlength=self.num_layers)


def layer_count_speedup(exit_layers: Tensor, num_layers: int) -> float:
    """``L·N / Σ_i e_i`` for 1-based exit layers ``e_i`` (``Σ_l L·m_l / Σ_l l·m_l``); NaN without samples."""
    if exit_layers.numel() == 0:
        return math.nan
    return num_layers * exit_layers.numel() / exit_layers.to(torch.float64).sum().item()


def check_criterion(
    threshold: Optional[float] = None,
    entropy: Optional[float] = None,
    patience: Optional[int] = None,
    option_prefix: str = "",
) -> dict[str, Union[float, int]]:
    """The one exit criterion given, as ``{name: value}``; a ValueError naming the option otherwise."""
    given = {name: value for name, value in zip(CRITERIA, (threshold, entropy, patience)) if value is not None}
    if len(given) != 1:
        names = " or ".join(f"`{option_prefix}{name}`" for name in CRITERIA)
        got = ", ".join(f"{option_prefix}{name}={value}" for name, value in given.items()) or "none"
        raise ValueError(f"Give exactly one early-exit criterion, {names} (got {got}).")
    (name, value), option = next(iter(given.items())), f"{option_prefix}{next(iter(given))}"
    if name == "threshold" and not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):
        raise ValueError(f"`{option}={value}` must be a probability in [0, 1].")
    if name == "entropy" and not (isinstance(value, (int, float)) and 0.0 <= value < math.inf):
        raise ValueError(f"`{option}={value}` must be a finite entropy >= 0 (nats).")
    if name == "patience" and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"`{option}={value}` must be an integer >= 0 (consecutive unchanged layers).")
    return {name: value}


class _ExitRule:
    """One criterion: which of the remaining samples exit after a block, and the per-sample state it carries."""

    def __init__(self, criterion: dict[str, Union[float, int]]) -> None:
        ((self.name, self.value),) = criterion.items()

    def start(self, num_samples: int, device: torch.device) -> Optional[tuple[Tensor, Tensor]]:
        """Per-sample state before block 1 (previous prediction and counter, for patience)."""
        if self.name != "patience":
            return None
        previous = torch.full((num_samples,), -1, dtype=torch.long, device=device)  # no class: layer 1 counts 0
        return previous, torch.zeros(num_samples, dtype=torch.long, device=device)

    def step(self, readout: Readout, state: Any) -> tuple[Tensor, Tensor, Any]:
        """Predictions ``(n,)``, exit decisions ``(n,)`` and the new state, from the head's readout ``(n,)`` fields."""
        predictions = readout.predictions
        if self.name == "threshold":
            return predictions, readout.max_prob >= self.value, state
        if self.name == "entropy":
            assert readout.entropy is not None  # asked for by the walk for this criterion
            return predictions, readout.entropy <= self.value, state
        previous, count = state
        count = torch.where(predictions == previous, count + 1, torch.zeros_like(count))
        return predictions, count >= self.value, (predictions, count)

    @staticmethod
    def select(state: Any, rows: Tensor) -> Any:
        """The state of the samples ``rows``."""
        return None if state is None else tuple(tensor[rows] for tensor in state)


@torch.no_grad()
def early_exit_predict(
    backbone: Backbone,
    inputs: Any,
    threshold: Optional[float] = None,
    entropy: Optional[float] = None,
    patience: Optional[int] = None,
) -> EarlyExitResult:
    """Classify a batch with early exit: exited samples leave the batch and never pass through later blocks.

    The batch runs block by block (:meth:`~layerwise.features.Backbone.embed`, ``run_block``, ``pool``,
    ``select``); after block l the shared head reads the remaining samples, those meeting the criterion (see the
    module docstring) are recorded with layer l and dropped, and the rest continue. At block L everyone left exits.
    The predictions and exit layers equal those of running each sample alone through the full model and applying
    the rule to its per-layer logits. Call it with the backbone in eval mode (dropout would make exits random).

    Args:
        backbone: a classification backbone implementing block-by-block execution (TimmViT, HFEncoder).
        inputs: one batch of model inputs (images ``(B, C, H, W)``; a dict of ``(B, T)`` tensors for HFEncoder).
        threshold: exit when the top-1 softmax probability is ``>= threshold``.
        entropy: exit when the softmax entropy (nats) is ``<= entropy``.
        patience: exit when the top-1 prediction has stayed the same for ``patience`` consecutive layers.

    Returns:
        :class:`EarlyExitResult` with ``predictions`` and ``exit_layers`` ``(B,)`` and ``layer_count_speedup``.
    """
    criterion = check_criterion(threshold, entropy, patience)
    if backbone.token_level:
        raise ValueError(f"Early exit classifies whole samples; {type(backbone).__name__} is token-level.")
    from layerwise.features.sharding import gathered_root

    # Sharded blocks (FSDP2) gather their weights in a collective at every call: every rank then runs every block,
    # on no rows once its own samples have all exited, so that no rank waits for a call another never makes.
    lockstep = is_sharded(backbone)
    with gathered_root(backbone):  # the root unit's embeddings and head, used here outside its forward
        return _walk(backbone, inputs, _ExitRule(criterion), criterion, lockstep)


def _walk(backbone: Backbone, inputs: Any, rule: "_ExitRule", criterion: dict[str, Any], lockstep: bool) -> Any:
    """The block-by-block walk of :func:`early_exit_predict`."""
    hidden, context = backbone.embed(inputs)
    num_samples, device, last = hidden.shape[0], hidden.device, backbone.num_layers - 1
    predictions = torch.zeros(num_samples, dtype=torch.long, device=device)
    exit_layers = torch.full((num_samples,), backbone.num_layers, dtype=torch.long, device=device)
    remaining = torch.arange(num_samples, device=device)  # batch row of every sample still running
    state = rule.start(num_samples, device)
    for index in range(backbone.num_layers if num_samples or lockstep else 0):
        hidden = backbone.run_block(index, hidden, context)
        pooled = backbone.pool(hidden, context)[None]
        readout = chunked_readout(backbone.head, pooled, entropy=rule.name == "entropy" and index < last)
        readout = Readout(*(None if value is None else value[0] for value in readout))
        if index == last:  # everyone left exits here: no criterion to evaluate
            predictions[remaining] = readout.predictions
            break
        layer_predictions, exits, state = rule.step(readout, state)
        exited = exits.nonzero().squeeze(1)  # the one host synchronisation per block
        if exited.numel() == 0:
            continue
        predictions[remaining[exited]] = layer_predictions[exited]
        exit_layers[remaining[exited]] = index + 1
        if exited.numel() == remaining.numel() and not lockstep:
            break
        keep = (~exits).nonzero().squeeze(1)
        hidden, context, state = hidden[keep], backbone.select(context, keep), rule.select(state, keep)
        remaining = remaining[keep]
    return EarlyExitResult(predictions, exit_layers, backbone.num_layers, criterion)


def is_sharded(module: Any) -> bool:
    """Whether any parameter of ``module`` is a ``DTensor`` (sharded by FSDP2's ``fully_shard``)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # a torch without distributed
        return False
    return any(isinstance(parameter, DTensor) for parameter in module.parameters())


def measure_speedup(
    backbone: Backbone,
    batches: Sequence[Any],
    threshold: Optional[float] = None,
    entropy: Optional[float] = None,
    patience: Optional[int] = None,
    repeats: int = 5,
    warmup: int = 1,
) -> EarlyExitResult:
    """Time early exit against the full model on the same batches: the measured next to the layer-count speedup.

    One *pass* runs every batch of ``batches`` (a list of model inputs; ``[x]`` for one batch) once. The full model
    is what :meth:`LayerwiseModule.forward` computes, ``backbone.head(backbone(inputs)[-1])``: every block, the
    shared head on the last layer. After ``warmup`` untimed passes of each, ``repeats`` timed passes alternate
    between the two (so both see the same load on a shared machine), under ``torch.no_grad``, with the device
    synchronised around every pass; each side's time is its fastest pass (as ``timeit`` recommends: slower passes
    measure interference, not the code). ``measured_speedup = full_seconds / early_exit_seconds``.

    Returns:
        :class:`EarlyExitResult` over all samples of ``batches`` (in order), with the timings filled in.
    """
    criterion = check_criterion(threshold, entropy, patience)
    if repeats < 1 or warmup < 0:
        raise ValueError(f"`repeats={repeats}` must be >= 1 and `warmup={warmup}` >= 0.")
    batches = list(batches)
    parameter = next(backbone.parameters(), None)
    device = parameter.device if parameter is not None else torch.device("cpu")

    def full() -> None:
        for inputs in batches:
            backbone.head(backbone(inputs)[-1])

    def early() -> list[EarlyExitResult]:
        return [early_exit_predict(backbone, inputs, **criterion) for inputs in batches]

    with torch.no_grad():
        for _ in range(warmup):
            full()
            early()
        full_times, early_times = [], []
        for _ in range(repeats):
            full_times.append(_timed(full, device)[0])
            seconds, results = _timed(early, device)
            early_times.append(seconds)
    result = EarlyExitResult(
        torch.cat([r.predictions for r in results]),
        torch.cat([r.exit_layers for r in results]),
        backbone.num_layers,
        criterion,
    )
    result.full_seconds, result.early_exit_seconds = min(full_times), min(early_times)
    result.measured_speedup = result.full_seconds / result.early_exit_seconds
    return result


def _timed(run: Any, device: torch.device) -> tuple[float, Any]:
    """Wall time of ``run()`` with the device synchronised before and after, and what it returned."""
    _synchronize(device)
    start = time.perf_counter()
    value = run()
    _synchronize(device)
    return time.perf_counter() - start, value


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()
