"""What a metric family of the analysis callbacks implements, and what it is fed."""

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Optional

import torch
from lightning.pytorch import Trainer
from torch import Tensor
from torchmetrics import Metric

from layerwise.metrics import Readout


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


@dataclass
class LayerBatch:
    """One batch of the selected layers.

    ``features`` ``(L, N, d)``; ``readout`` the shared head's per-layer predictions, top-1 probability and loss
    ``(L, N)``; ``targets`` ``(N,)``; ``exit_readout`` that of separate exit heads, if any. ``sampled`` indexes the
    rows kept for the feature-similarity statistics (every row unless tokens are subsampled).
    """

    features: Tensor
    readout: Readout
    targets: Optional[Tensor]
    exit_readout: Optional[Readout] = None
    sampled: Optional[Tensor] = None

    def nonfinite_rows(self) -> Tensor:
        """(L, N) bool: the rows whose feature, top-1 probability or loss is NaN or infinite, per layer."""
        bad = ~torch.isfinite(self.features).all(dim=-1)
        for value in (self.readout.max_prob, self.readout.nll):
            if value is not None:
                bad |= ~torch.isfinite(value)
        return bad

    def keep(self, rows: Tensor) -> "LayerBatch":
        """The batch restricted to the rows where ``rows`` (N,) bool is True (``sampled`` renumbered)."""

        def take(readout: Optional[Readout]) -> Optional[Readout]:
            if readout is None:
                return None
            return Readout(*(None if value is None else value[:, rows] for value in readout))

        sampled = self.sampled
        if sampled is not None:
            position = torch.cumsum(rows.long(), 0) - 1
            sampled = position[sampled[rows[sampled]]]
        targets = None if self.targets is None else self.targets[rows]
        return LayerBatch(self.features[:, rows], take(self.readout), targets, take(self.exit_readout), sampled)

    @property
    def nbytes(self) -> int:
        """Bytes held by the batch's tensors (features, readouts, targets, sampled rows)."""
        readouts = [value for readout in (self.readout, self.exit_readout) if readout is not None for value in readout]
        tensors = [self.features, self.targets, self.sampled, *readouts]
        return sum(value.numel() * value.element_size() for value in tensors if value is not None)

    @classmethod
    def cat(cls, batches: Sequence["LayerBatch"]) -> "LayerBatch":
        """One batch of ``batches``' rows in order (their ``sampled`` rows renumbered); one batch is returned as is."""
        if len(batches) == 1:
            return batches[0]
        first = batches[0]

        def join(values: list[Optional[Tensor]], dim: int) -> Optional[Tensor]:
            return None if values[0] is None else torch.cat(values, dim=dim)  # type: ignore[arg-type]

        def readouts(pick: Any) -> Optional[Readout]:
            if pick(first) is None:
                return None
            fields = range(len(Readout._fields))
            return Readout(*(join([pick(batch)[field] for batch in batches], 1) for field in fields))

        sampled = None
        if any(batch.sampled is not None for batch in batches):
            parts, offset = [], 0
            for batch in batches:
                rows = batch.features.shape[1]
                index = batch.sampled if batch.sampled is not None else torch.arange(rows, device=batch.features.device)
                parts.append(index + offset)
                offset += rows
            sampled = torch.cat(parts)
        return cls(
            torch.cat([batch.features for batch in batches], dim=1),
            readouts(lambda batch: batch.readout),  # type: ignore[arg-type]
            join([batch.targets for batch in batches], 0),
            readouts(lambda batch: batch.exit_readout),
            sampled,
        )

    @property
    def sampled_features(self) -> Tensor:
        """The features of the rows kept for COS/CKA/saturation-COS: ``(L, N', d)``."""
        return self.features if self.sampled is None else self.features[:, self.sampled]


class Family(abc.ABC):
    """One metric family of a :class:`~layerwise.callbacks.LayerwiseMonitor`: its metrics, results, scalars, charts.

    The monitor's families share its features (one forward, one :class:`LayerBatch` per group of batches) and its
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
    def update(self, batch: LayerBatch) -> None:
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
