"""Shared base for the layer-wise metrics: float64 sum states and the bookkeeping of where they were reduced."""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Optional, Union, cast

import torch
import torch.distributed as dist
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities.data import apply_to_collection

from layerwise._compat import Float64StatesOnCast


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


class _SumStateMetric(Float64StatesOnCast, Metric):
    """A Metric whose tensor states are all float64 sums, so they can be reduced by ``all_reduce_sum_states``.

    Built only on torchmetrics' public interface: states are registered with ``add_state(dist_reduce_fx="sum")``
    and listed in :attr:`sum_state_names`; ``compute`` is never cached (``compute_with_cache=False``), so states
    changed by an external reduction are always read afresh.

    Memory: torchmetrics keeps a copy of every state's default to restore on ``reset``. Here the registered default
    is a 0-dim placeholder and the zeros of the real shape are allocated by :meth:`reset` (and at construction), so
    a large state (``LayerCKA``'s (L*d)^2 sums) is held once, not twice.

    ``_sum_states_reduced`` records that ``all_reduce_sum_states`` already made the states global; it guards
    against summing twice and tells metrics with a collective ``compute`` which process group to use.
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    if TYPE_CHECKING:  # the states, set by name in _add_sum_state: Tensors, not nn.Module's Tensor | Module
        _forward_cache: Any  # None in torchmetrics' __init__, a batch's value after forward

        def __getattr__(self, name: str) -> Tensor: ...

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("compute_with_cache", False)
        super().__init__(**kwargs)
        self._sum_state_shapes: dict[str, tuple[int, ...]] = {}
        self._sum_states_reduced = False
        self._sum_states_group: Optional[Any] = None
        self._synced_by_torchmetrics = False
        self._synced_group: Optional[Any] = None
        self._casting_dtype = False

    def _wrap_compute(self, compute: Callable) -> Callable:
        """The compute wrapper of torchmetrics (sync, clone), but every result keeps the shape ``compute`` gave it.

        torchmetrics squeezes each one-element tensor to 0-dim, so a per-layer or per-step vector of length 1 (two
        blocks, one selected layer) would reach the JSON as a bare number instead of a one-element list.
        """
        shapes: list[torch.Size] = []

        def recording(*args: Any, **kwargs: Any) -> Any:
            value = compute(*args, **kwargs)
            shapes.clear()
            apply_to_collection(value, Tensor, lambda tensor: shapes.append(tensor.shape))
            return value

        squeezed = super()._wrap_compute(recording)

        @functools.wraps(compute)
        def shaped(*args: Any, **kwargs: Any) -> Any:
            shapes.clear()
            value = squeezed(*args, **kwargs)
            if not shapes:  # nothing computed (a cached value)
                return value
            original = iter(list(shapes))
            return apply_to_collection(value, Tensor, lambda tensor: tensor.reshape(next(original)))

        return shaped

    @property
    def sum_state_names(self) -> list[str]:
        """Names of the float64 sum states, in registration order."""
        return list(self._sum_state_shapes)

    def _add_sum_state(self, name: str, shape: tuple[int, ...]) -> None:
        """Register a float64 zero state of ``shape`` summed across processes (its default is a placeholder).

        The zeros are made on torch's default device: a metric built inside ``with torch.device("cuda"):`` has its
        states made on the GPU, not filled on the host and copied (793 MiB for ``CrossModelCKA`` at GPT-2-small's
        shape); ``.to(device)`` then moves nothing and sets :attr:`device`.
        """
        self.add_state(name, default=torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self._sum_state_shapes[name] = tuple(shape)
        setattr(self, name, torch.zeros(shape, dtype=torch.float64))

    def set_dtype(self, dst_type: Union[str, torch.dtype]) -> Metric:
        """Cast the states to ``dst_type`` (the one cast that may leave float64, see :meth:`_apply`)."""
        self._casting_dtype = True
        try:
            return super().set_dtype(dst_type)
        finally:
            self._casting_dtype = False

    def reset(self) -> None:
        """Reset the states to zeros of their shapes and forget that they were reduced."""
        super().reset()
        dtype = torch.float64
        for name, shape in self._sum_state_shapes.items():
            placeholder = getattr(self, name)
            setattr(
                self,
                name,
                torch.zeros(
                    shape,
                    dtype=placeholder.dtype if placeholder.is_floating_point() else dtype,
                    device=placeholder.device,
                ),
            )
        self._sum_states_reduced = False
        self._sum_states_group = None

    def sync(
        self,
        dist_sync_fn: Optional[Callable] = None,
        process_group: Optional[Any] = None,
        should_sync: bool = True,
        distributed_available: Optional[Callable] = None,
    ) -> None:
        """Torchmetrics' own sync (``sync_on_compute=True``); remembers its process group for collective computes."""
        if should_sync:
            self._before_sync(process_group or self.process_group, distributed_available)
        super().sync(
            dist_sync_fn=dist_sync_fn,
            process_group=process_group,
            should_sync=should_sync,
            distributed_available=distributed_available,
        )
        group = process_group or self.process_group
        self._synced_by_torchmetrics = bool(should_sync) and _world_size(group) > 1
        self._synced_group = group

    def _before_sync(self, group: Optional[Any], distributed_available: Optional[Callable]) -> None:
        """What every rank does to its states before torchmetrics sums them over ``group`` (nothing here)."""

    def unsync(self, should_unsync: bool = True) -> None:
        """Undo :meth:`sync`."""
        super().unsync(should_unsync)
        self._synced_by_torchmetrics = False

    def _all_reduce_if_global(self, tensor: Tensor) -> None:
        """Sum a rank-local tensor in place over the processes whose states are currently merged into this metric.

        Collective: every rank must call it. A no-op when the states are rank-local (no sync happened), so a
        ``compute`` on unsynced states stays local.
        """
        if self._synced_by_torchmetrics:  # torchmetrics' own sync_on_compute
            group = self._synced_group
        elif self._sum_states_reduced:
            group = self._sum_states_group
        else:
            return
        if _world_size(group) > 1:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)


def _first(stacked: Tensor) -> Tensor:
    """Reduction of a state that is equal on every rank when reduced (the aligned shift): keep one copy."""
    return stacked[0]


class _ShiftedSumStateMetric(_SumStateMetric):
    """A sum-state metric whose second moments are taken around a per-layer shift, so large offsets lose nothing.

    Raw float64 second moments of features with mean/std = r lose about 2 log10(r) of their 16 digits when they
    are centred at the end (12 digits at an offset of 1e6). Here every statistic is a sum of ``h - shift``, with
    ``shift`` (L, d) the mean of the first batch this rank sees, so the sums stay of the order of the spread.

    Ranks (and merged instances) have different shifts, so before states are summed they are re-expressed around
    one common shift, the count-weighted mean of the shifts, by :meth:`_recentred` (exact algebra:
    ``sum(h - c') = sum(h - c) + n (c - c')``, and the same for the second moments). This happens in
    ``all_reduce_sum_states`` (one small extra all-reduce), in torchmetrics' own ``sync`` and in ``merge_state``.
    ``forward`` returns the batch value from the functional form and accumulates like ``update``.
    """

    shift: Tensor  # the state of _add_shift_state

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._has_shift = False

    def _add_shift_state(self, shape: tuple[int, ...]) -> None:
        """Register the (L, d) float64 shift; equal on every rank once aligned, so a reduction keeps one copy."""
        self.add_state("shift", default=torch.zeros(shape, dtype=torch.float64), dist_reduce_fx=_first)

    def _shifted(self, features: Tensor) -> Tensor:
        """Float64 ``features - shift`` (L, B, d); the first batch of a rank sets the shift to its own mean."""
        x = features.to(torch.float64)
        if not self._has_shift:
            if x.shape[1] == 0:
                return x
            self._take_shift(x.mean(dim=1))
        return x - self.shift.to(x.device).unsqueeze(1)

    def _take_shift(self, mean: Tensor) -> None:
        """This rank's first batch sets the shift: ``mean``, float64, of the shift's shape."""
        self.shift = mean.to(self.shift.device)
        self._has_shift = True

    def reset(self) -> None:
        """Reset the states; the next batch sets a new shift."""
        super().reset()
        self._has_shift = False

    @abc.abstractmethod
    def _sample_count(self, states: dict[str, Tensor]) -> Tensor:
        """Number of samples behind ``states`` (a 0-dim float64 tensor)."""

    @abc.abstractmethod
    def _recentred(self, states: dict[str, Tensor], delta: Tensor) -> dict[str, Tensor]:
        """The sum states around ``shift - delta`` instead of ``shift`` (``delta`` = old shift - new shift)."""

    def _states(self) -> dict[str, Tensor]:
        return {name: getattr(self, name) for name in self.sum_state_names}

    def _move_shift(self, new_shift: Tensor) -> None:
        """Re-express this instance's sums around ``new_shift`` (local, exact in real arithmetic)."""
        new_shift = new_shift.to(device=self.shift.device, dtype=torch.float64)
        for name, value in self._recentred(self._states(), self.shift - new_shift).items():
            setattr(self, name, value)
        self.shift = new_shift
        self._has_shift = True

    def _align_shift(self, process_group: Optional[Any] = None) -> None:
        """Collective: move every rank's sums to the count-weighted mean of the ranks' shifts."""
        if _world_size(process_group) == 1:
            return
        count = self._sample_count(self._states()).reshape(1)
        packed = torch.cat([(count * self.shift).reshape(-1), count]).to(torch.float64)
        dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=process_group)
        total = packed[-1]
        common = packed[:-1].view_as(self.shift) / total if total > 0 else torch.zeros_like(self.shift)
        self._move_shift(common)

    def _before_sync(self, group: Optional[Any], distributed_available: Optional[Callable]) -> None:
        """Align the ranks' shifts before torchmetrics' sync, so that its sum of the states is exact."""
        distributed = distributed_available or self.distributed_available_fn
        if callable(distributed) and distributed():
            self._align_shift(group)

    def merge_state(self, incoming_state: Any) -> None:
        """Add another instance's states (or a state dict), re-expressed around this instance's shift."""
        incoming = incoming_state.metric_state if isinstance(incoming_state, Metric) else dict(incoming_state)
        incoming = cast(dict[str, Tensor], incoming)  # a sum-state metric's states are all tensors
        states = {name: incoming[name].to(torch.float64) for name in self.sum_state_names}
        if float(self._sample_count(states)) == 0:
            return
        if not self._has_shift or float(self._sample_count(self._states())) == 0:
            self._move_shift(incoming["shift"])
        states = self._recentred(states, incoming["shift"].to(self.shift) - self.shift)
        for name, value in states.items():
            setattr(self, name, getattr(self, name) + value.to(getattr(self, name).device))
