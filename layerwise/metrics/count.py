"""The number of evaluated samples, as a sum state reduced with the other metrics."""

from typing import Any

import torch
from torch import Tensor

from layerwise.metrics._base import _SumStateMetric


class SampleCount(_SumStateMetric):
    """Counts the samples fed to ``update`` (first dimension of ``targets``/``features`` after ``dim``)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._add_sum_state("count", ())

    def update(self, num_samples: int) -> None:
        """Add ``num_samples``."""
        self.count += num_samples

    def compute(self) -> Tensor:
        """Total count as a float64 scalar."""
        return self.count.to(torch.float64)


class _LayerRows(_SumStateMetric):
    """A sum-state metric fed one value per layer and row: ``update`` takes ``(L, N)``; an (L,) and a () state."""

    _states: tuple[str, str]  # the names of its (L,) state and its () state

    def __init__(self, num_layers: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_layers = num_layers
        self._add_sum_state(self._states[0], (num_layers,))
        self._add_sum_state(self._states[1], ())

    def _check_rows(self, values: Tensor) -> None:
        if values.ndim != 2 or values.shape[0] != self.num_layers:
            shape = tuple(values.shape)
            raise ValueError(f"{type(self).__name__} expects (L={self.num_layers}, N) values, got {shape}.")


class NonFiniteRows(_LayerRows):
    """Counts the samples with a NaN or infinite value, per layer and in all (a sample bad at any layer).

    States (float64, summed across processes): ``per_layer`` (L,) samples non-finite at each layer, ``any_layer``
    samples non-finite at one layer or more. ``compute()`` gives ``per_layer``; :attr:`rows` the total.

    Shapes:
        ``update(bad)``: (L, N) bool, True where sample n is non-finite at layer l.
    """

    _states = ("per_layer", "any_layer")

    def update(self, bad: Tensor) -> None:
        """Add one batch's (L, N) mask."""
        self._check_rows(bad)
        self.per_layer += bad.sum(dim=1).to(self.per_layer)
        self.any_layer += bad.any(dim=0).sum().to(self.any_layer)

    @property
    def rows(self) -> int:
        """Samples non-finite at one layer or more."""
        return int(self.any_layer.item())

    def compute(self) -> Tensor:
        """Samples non-finite at each layer: (L,) float64."""
        return self.per_layer.clone()


class RowMean(_SumStateMetric):
    """The exact mean of the values fed to ``update``: float64 sum and count states, summed across processes.

    Unlike a mean of per-process (or per-batch) means, the mean over all processes' rows whatever each one holds:
    what a module logs with ``self.log(key, metric)`` for ``<stage>/loss`` and ``<stage>/acc``, fed only the real
    rows of each rank (``DistributedSampler``'s padding dropped). torchmetrics syncs the states when Lightning calls
    ``compute`` (``sync_on_compute=True``, its default).

    Shapes:
        ``update(values)``: any shape, every element one row.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._add_sum_state("total", ())
        self._add_sum_state("count", ())

    def update(self, values: Tensor) -> None:
        """Add the elements of ``values`` (summed in float64)."""
        self.total += values.detach().to(torch.float64).sum().to(self.total.device)
        self.count += values.numel()

    def compute(self) -> Tensor:
        """The float64 mean over every row fed, NaN when none was."""
        return self.total / self.count


class LayerMean(_LayerRows):
    """The exact mean over rows of one value per layer and row: ``(L, N)`` -> ``(L,)``, float64 sums.

    A per-layer analysis's simplest statistic (``examples/feature_norm.py``: the mean feature norm of every layer):
    the sum per layer and the row count, summed across processes (with ``sync_on_compute=False``, in the
    analyses' one all-reduce).

    Shapes:
        ``update(values)``: ``(L, N)``, one value per layer and row.
    """

    _states = ("total", "count")

    def update(self, values: Tensor) -> None:
        """Add the rows of ``values`` (L, N) (summed in float64)."""
        self._check_rows(values)
        self.total += values.detach().to(torch.float64).sum(dim=1).to(self.total.device)
        self.count += values.shape[1]

    def compute(self) -> Tensor:
        """The float64 mean of every layer over every row fed, (L,); NaN when none was."""
        return self.total / self.count
