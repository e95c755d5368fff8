"""What a metric family of the analysis callbacks implements; it is fed the module's ``LayerOutputs``."""

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lightning.pytorch import Trainer
from torch import Tensor
from torchmetrics import Metric

from layerwise.engines.readout import LayerOutputs


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


class Family(abc.ABC):
    """One metric family of a :class:`~layerwise.callbacks.LayerwiseMonitor`: its metrics, results, scalars, charts.

    The monitor's families share its features (one forward, one :class:`~layerwise.engines.readout.LayerOutputs`, its
    layers selected, per group of batches) and its
    one all-reduce. The names of what a family reports are those of an analysis callback (``compute``, ``scalars``,
    ``charts``): the monitor's are the union of its families'. ``spec`` is the layer spec the metrics were built for
    (set before :meth:`build`).
    """

    spec: LayerSpec

    @property
    def joins_batches(self) -> bool:
        """Whether :meth:`update` may get several batches joined into one.

        False for an estimator defined per dataloader minibatch: then every family of its dataloader is fed batch by
        batch.
        """
        return True

    def configure(self, trainer: Trainer, spec: LayerSpec) -> None:  # noqa: B027 - an optional hook
        """Read what the family needs from the run (e.g. class frequencies) before ``build``; default: nothing."""

    @abc.abstractmethod
    def build(self, spec: LayerSpec) -> list[Metric]:
        """Create the metrics (constructed with ``sync_on_compute=False``) and return them."""

    @abc.abstractmethod
    def update(self, batch: LayerOutputs) -> None:
        """Feed consecutive evaluation batches, joined into one.

        Up to ``_loader.GROUP_BATCHES`` batches or ``_loader.GROUP_BYTES``, rows in order: a sum over rows is the
        same. A family whose result depends on where a dataloader batch ends says so by :attr:`joins_batches`.
        """

    @abc.abstractmethod
    def compute(self) -> dict[str, Any]:
        """Results keyed as in the JSON summary (states are already reduced across ranks)."""

    def scalars(self, results: dict[str, Any]) -> dict[str, float]:
        """Scalars to log from the monitor's results, keyed without the stage prefix, e.g. ``acc/layer_03``."""
        return {}

    def charts(self) -> dict[str, str]:
        """TensorBoard multi-line charts: title -> regex of tag suffixes (all layers of one quantity)."""
        return {}


def shaped(value: Tensor, *shape: int) -> Tensor:
    """``value`` as ``shape``: torchmetrics squeezes one-element results to 0-dim, as a single layer (L = 1) gives."""
    return value.reshape(shape)


def per_layer(values: Sequence[float], spec: LayerSpec, name: str) -> dict[str, float]:
    """Scalars ``name/layer_XX`` of one value per selected layer."""
    return {f"{name}/{spec.key(number)}": float(value) for number, value in zip(spec.layer_numbers, values)}
