"""Shared base for the layer-wise metrics: float64 sum states and the bookkeeping of where they were reduced."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch import Tensor
from torch.nn import Module
from torchmetrics import Metric


def _world_size(process_group: Optional[Any] = None) -> int:
    """Number of processes in ``process_group``, 1 when torch.distributed is not initialised."""
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(process_group)


def _check_positive_int(name: str, value: Any) -> int:
    """Return ``value`` if it is a positive int, else raise a ValueError naming the argument."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"Expected `{name}` to be a positive int, got {value!r}.")
    return value


class _SumStateMetric(Metric):
    """A Metric whose tensor states are all float64 sums, so they can be reduced by ``all_reduce_sum_states``.

    ``_sum_states_reduced`` records that ``all_reduce_sum_states`` already made the states global; it guards
    against summing twice and tells metrics with a collective ``compute`` which process group to use.
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._sum_states_reduced = False
        self._sum_states_group: Optional[Any] = None

    def _add_sum_state(self, name: str, shape: tuple[int, ...]) -> None:
        """Register a float64 zero state of ``shape`` summed across processes."""
        self.add_state(name, default=torch.zeros(shape, dtype=torch.float64), dist_reduce_fx="sum")

    def _apply(self, fn: Callable, exclude_state: Sequence[str] = "") -> Module:
        """Move the states like torchmetrics, but keep them float64 under a dtype cast such as ``.to(torch.bfloat16)``.

        torchmetrics only guards ``.half()``/``.float()``; a parent module's ``.to(dtype)`` (e.g. Lightning's
        "bf16-true" precision) would otherwise turn the float64 sums into bf16. ``set_dtype`` still casts.
        """
        probe = fn(torch.zeros((), dtype=torch.float64, device=self.device))
        if probe.dtype != torch.float64 and not self._dtype_convert:
            device = probe.device
            return super()._apply(lambda t: t.to(device), exclude_state)
        return super()._apply(fn, exclude_state)

    def reset(self) -> None:
        """Reset the states and forget that they were reduced."""
        super().reset()
        self._sum_states_reduced = False
        self._sum_states_group = None

    def _all_reduce_if_global(self, tensor: Tensor) -> None:
        """Sum a rank-local tensor in place over the processes whose states are currently merged into this metric.

        Collective: every rank must call it. A no-op when the states are rank-local (no sync happened), so a
        ``compute`` on unsynced states stays local.
        """
        if self._is_synced:  # torchmetrics' own sync_on_compute, which uses self.process_group
            group = self.process_group
        elif self._sum_states_reduced:
            group = self._sum_states_group
        else:
            return
        if _world_size(group) > 1:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
