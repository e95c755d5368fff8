"""A seeded sample of rows chosen by global sample index: what the neighbourhood measures read."""

from typing import Any, Optional

import numpy as np
import torch
import torch.distributed as dist
from torch import Tensor
from torchmetrics import Metric

from layerwise.metrics.functional_neighbours import lowest_keys, sample_keys


class LayerRowSample(Metric):
    """The ``size`` evaluated rows of lowest seeded key of their global sample index, every layer, in float64.

    Which rows are kept depends only on the samples' global indices (the dataset index of each row, given with
    every batch) and ``seed``: a bottom-``size`` sketch of the keys :func:`~layerwise.metrics.functional_neighbours.\
sample_keys`, mergeable across batches and ranks, so the sample is the same for any batch size and number of
    processes, and :meth:`compute` returns its rows ordered by global index.

    Memory: ``8 · L · size · d`` bytes per rank (float64; 12 × 768 at size 1024: 75 MB), and at :meth:`compute`
    under DDP the gathered samples, up to ``world_size`` times that, once.

    DDP: the kept rows are no sum, so they are not in the evaluation's one all-reduce (``sync_on_compute`` stays
    True and the metric holds no torchmetrics state); :meth:`compute` gathers every rank's rows itself (a
    collective: every rank calls it).

    Args:
        num_layers: L.
        size: the most rows kept (``> 0``).
        seed: the seed of the keys.
        dim: d, where known: only for :attr:`kept_bytes`.
    """

    full_state_update = False

    def __init__(self, num_layers: int, size: int, seed: int = 0, dim: Optional[int] = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise ValueError(f"`knn_sample_size={size!r}` must be a positive int.")
        self.num_layers, self.size, self.seed = num_layers, size, int(seed)
        self.kept_bytes = 8 * num_layers * size * (dim or 0)  # the rows at most, with their keys and indices
        self.kept_bytes += 16 * size
        self._reset_rows()

    def _reset_rows(self) -> None:
        self._keys = np.zeros(0, dtype=np.uint64)
        self._index = np.zeros(0, dtype=np.int64)
        self._rows: Optional[Tensor] = None  # (L, kept, d) float64

    def reset(self) -> None:
        """Reset the states and drop the kept rows."""
        super().reset()
        self._reset_rows()

    def update(self, features: Tensor, index: Optional[Tensor]) -> None:
        """Offer a batch's rows ``features`` (L, B, d) with their global sample indices ``index`` (B,)."""
        if index is None:
            raise ValueError(
                "`mutual_knn`/`cknna` choose rows by global sample index, which this evaluation does not know: they "
                "need one row per sample (not a language model's tokens) and a sequential or DistributedSampler loader."
            )
        if features.ndim != 3 or features.shape[0] != self.num_layers or tuple(index.shape) != features.shape[1:2]:
            raise ValueError(
                f"Expected features (L={self.num_layers}, B, d) and index (B,), got {tuple(features.shape)} and "
                f"{tuple(index.shape)}."
            )
        new_index = index.detach().cpu().numpy().astype(np.int64)
        keys = np.concatenate([self._keys, sample_keys(new_index, self.seed)])
        indices = np.concatenate([self._index, new_index])
        keep = lowest_keys(keys, indices, self.size)
        old = self._keys.shape[0]
        if self._rows is not None and old == keep.shape[0] and bool((keep < old).all()):
            return  # none of the batch's rows enter the sample
        rows = features.detach().double()
        joined = rows if self._rows is None else torch.cat([self._rows, rows], dim=1)
        self._rows = joined.index_select(1, torch.from_numpy(keep).to(joined.device))
        self._keys, self._index = keys[keep], indices[keep]

    def compute(self) -> Tensor:
        """The kept rows of every rank, the ``size`` of lowest key, ordered by global index: (L, n, d) float64."""
        keys, index, rows = self._keys, self._index, self._rows
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            keys, index, rows = self._gathered()
        if rows is None:
            return torch.zeros(self.num_layers, 0, 0, dtype=torch.float64)
        keep = lowest_keys(keys, index, self.size)
        keep = keep[np.argsort(index[keep], kind="stable")]
        return rows.index_select(1, torch.from_numpy(keep).to(rows.device))

    def _gathered(self) -> tuple[np.ndarray, np.ndarray, Optional[Tensor]]:
        """Every rank's keys, indices and rows (padded to the longest in one all_gather each)."""
        world = dist.get_world_size()
        device = self._rows.device if self._rows is not None else self.device
        count = torch.tensor([self._index.shape[0], 0 if self._rows is None else self._rows.shape[2]], device=device)
        counts = [torch.zeros_like(count) for _ in range(world)]
        dist.all_gather(counts, count)
        most, width = max(int(c[0]) for c in counts), max(int(c[1]) for c in counts)
        if most == 0:
            return self._keys, self._index, None
        pad = most - self._index.shape[0]
        index = torch.from_numpy(np.concatenate([self._index, np.zeros(pad, dtype=np.int64)])).to(device)
        keys = torch.from_numpy(np.concatenate([self._keys, np.zeros(pad, dtype=np.uint64)]).view(np.int64))
        keys = keys.to(device)
        rows = torch.zeros(self.num_layers, most, width, dtype=torch.float64, device=device)
        if self._rows is not None:
            rows[:, : self._rows.shape[1]] = self._rows
        parts: list[list[Tensor]] = []
        for value in (index, keys, rows):
            gathered = [torch.empty_like(value) for _ in range(world)]
            dist.all_gather(gathered, value)
            parts.append(gathered)
        lengths = [int(c[0]) for c in counts]
        index_all = np.concatenate([p.cpu().numpy()[:n] for p, n in zip(parts[0], lengths)])
        keys_all = np.concatenate([p.cpu().numpy()[:n].view(np.uint64) for p, n in zip(parts[1], lengths)])
        rows_all = torch.cat([p[:, :n] for p, n in zip(parts[2], lengths)], dim=1)
        return keys_all, index_all, rows_all
