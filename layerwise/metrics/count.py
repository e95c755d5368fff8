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
