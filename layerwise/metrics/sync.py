"""One all-reduce for a whole family of sum-state metrics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional, cast

import torch
import torch.distributed as dist
from torch import Tensor
from torchmetrics import Metric

from layerwise.metrics._base import _ShiftedSumStateMetric, _SumStateMetric, _world_size


def all_reduce_sum_states(metrics: Sequence[Metric], process_group: Optional[Any] = None) -> None:
    """Sum the states of several metrics over processes with a single ``all_reduce``.

    torchmetrics syncs each metric on its own, state by state, and with an ``all_gather`` (world-size copies of
    every state). Here every tensor state of every metric (all must be ``dist_reduce_fx="sum"``) is packed into one
    flat float64 buffer, reduced with one ``all_reduce(SUM)`` and written back, so a family of metrics costs one
    collective. Construct the metrics with ``sync_on_compute=False``, call this on every rank after the last
    ``update`` and before ``compute``, and ``reset`` before the next accumulation; updating in between would mix
    global and local statistics. A no-op outside torch.distributed or with a world size of 1.

    Metrics whose moments are taken around a shift (``LayerCKA``, ``LayerNC1``) first align their shifts with one
    small all-reduce each (L x d floats), so that the summed moments are exact whatever the offset of the features.

    The centered ``LayerCosineSimilarity``/``SaturationCosine`` then run one more, tiny (L x L or L) all-reduce in
    ``compute``: their per-sample cosines need the *global* mean, which exists only after this reduction, so the
    cosine sums of their buffers cannot travel in the same buffer.

    Args:
        metrics: metrics whose states are all tensors summed across processes.
        process_group: process group to reduce over (default: the whole world).

    Raises:
        ValueError: a metric syncs on compute itself (its states would be summed twice).
        TypeError: a metric has a list state or a state not reduced by sum.
        RuntimeError: the states of a metric were already reduced since its last ``reset``.
    """
    metrics = list(metrics)
    if _world_size(process_group) == 1:
        return
    states: list[tuple[Metric, str, Tensor]] = []
    for metric in metrics:
        name = type(metric).__name__
        if metric.sync_on_compute:
            raise ValueError(f"{name} has sync_on_compute=True: construct it with sync_on_compute=False.")
        if not isinstance(metric, _SumStateMetric):
            raise TypeError(f"{name} is not a layerwise sum-state metric (its states' reductions are not known).")
        if metric._sum_states_reduced:
            raise RuntimeError(f"The states of {name} were already all-reduced; call reset() before reusing it.")
    for metric in metrics:
        if isinstance(metric, _ShiftedSumStateMetric):
            metric._align_shift(process_group)  # one small all-reduce: every rank's sums around one shift
        for attr in cast(_SumStateMetric, metric).sum_state_names:  # checked above
            states.append((metric, attr, getattr(metric, attr)))
    if states:
        device = states[0][2].device
        flat = torch.cat([value.reshape(-1).to(device=device, dtype=torch.float64) for _, _, value in states])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=process_group)
        offset = 0
        for metric, attr, value in states:
            reduced = flat[offset : offset + value.numel()].view(value.shape)
            setattr(metric, attr, reduced.to(device=value.device, dtype=value.dtype))
            offset += value.numel()
    for metric in metrics:  # compute is never cached (compute_with_cache=False): it reads the reduced states
        metric._sum_states_reduced = True
        metric._sum_states_group = process_group
