"""Metrics comparing two models on the same tokens: exact and minibatch CKA across models (float64 sum states).

The math is in :mod:`layerwise.metrics.functional_compare`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Optional

import torch
from torch import Tensor
from torchmetrics.utilities import rank_zero_warn

from layerwise.errors import LayerwiseWarning
from layerwise.metrics._base import _check_positive_int, _ShiftedSumStateMetric, _SumStateMetric
from layerwise.metrics.functional_compare import _check_pair, _cross_cka_compute, chunk_hsic
from layerwise.metrics.functional_family import check_cross_measures, cross_model_measures

PRECISIONS = ("exact", "fast")
_FAST_ROWS = 2048  # rows of the cross moment per float32 product in precision="fast"


class CrossModelCKA(_ShiftedSumStateMetric):
    r"""Exact linear CKA between every layer of model A and every layer of model B, streamed over tokens.

    States (float64, summed, around a per-rank shift that is aligned before any reduction, so an offset of 1e6 costs
    nothing): ``count``, ``sum_a`` (L_A, d_A), ``sum_b`` (L_B, d_B), ``self_a`` (L_A, d_A, d_A), ``self_b``
    (L_B, d_B, d_B) and ``cross`` (L_A d_A, L_B d_B): ``8 (L_A d_A^2 + L_B d_B^2 + L_A d_A L_B d_B)`` bytes, 793 MiB for
    two 12 x 768 models, whatever the number of tokens. Identical on 1 or n DDP processes.

    The cross moment of every pair costs 2 (L_A d_A)(L_B d_B) float64 operations per token — for two models of equal
    shape about L/24 of their two forward passes in operations, run in float64. ``pairs="diagonal"`` keeps only the
    pairs (i, i) of two models of equal depth (the arccos distance needs nothing else): ``cross`` (L, d_A, d_B),
    L times less work and memory; ``compute`` then holds NaN off the diagonal.

    ``precision="fast"``: each batch's features minus the shift (subtracted in float64, in the same pass that
    reorders them into token rows) are rounded once to float32 (bfloat16 and float16 features too; float64 stays
    float64). The batch's sums (accumulated in float64) and its self and cross moments (float32 products) are taken
    from those rounded values and added to the same float64 states (the cross moment in blocks of 2,048 rows, so no
    (L_A d_A, L_B d_B) temporary). The shift keeps the values small, so an offset costs nothing here either; only the
    float32 rounding of each batch remains. Stated error: at most 1e-4 absolute on every CKA value. Measured: 1.5e-9
    on two random GPT-2-small base models (12 x 768, batches of 512 tokens, ``benchmarks/compare_precision.py``),
    below 1e-7 on features with outlier dimensions and an offset of 1e3 (``tests/metrics/test_compare_fast.py``). The
    products run at the float32 rate; on a GPU with ``torch.set_float32_matmul_precision("high")`` at the TF32 rate,
    1.9e-6 (H200) and 2.1e-6 (H100) measured at GPT-2-small's shape (``--matmul-precision high``). The float64
    additions remain.

    Args:
        layers_a: L_A and d_A of model A.
        dim_a: L_A and d_A of model A.
        layers_b: L_B and d_B of model B.
        dim_b: L_B and d_B of model B.
        pairs: ``"all"`` (every layer of A against every layer of B) or ``"diagonal"`` (layer i against layer i).
        precision: ``"exact"`` (every product in float64, the default) or ``"fast"`` (float32 products, float64 sums).
        kwargs: torchmetrics ``Metric`` options.

    Shapes:
        ``update(a, b)``: (L_A, N, d_A) and (L_B, N, d_B), the same N tokens. ``compute()``: (L_A, L_B) float64.
    """

    def __init__(
        self,
        layers_a: int,
        dim_a: int,
        layers_b: int,
        dim_b: int,
        pairs: str = "all",
        precision: str = "exact",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if precision not in PRECISIONS:
            raise ValueError(f"Expected `precision` 'exact' or 'fast', got {precision!r}.")
        self.precision = precision
        self._buffer: Optional[Tensor] = None
        self.layers_a, self.dim_a = _check_positive_int("layers_a", layers_a), _check_positive_int("dim_a", dim_a)
        self.layers_b, self.dim_b = _check_positive_int("layers_b", layers_b), _check_positive_int("dim_b", dim_b)
        if pairs not in ("all", "diagonal"):
            raise ValueError(f"Expected `pairs` 'all' or 'diagonal', got {pairs!r}.")
        if pairs == "diagonal" and layers_a != layers_b:
            raise ValueError(f"`pairs='diagonal'` needs models of equal depth; got {layers_a} and {layers_b} layers.")
        self.pairs = pairs
        self._add_sum_state("count", ())
        self._add_sum_state("sum_a", (layers_a, dim_a))
        self._add_sum_state("sum_b", (layers_b, dim_b))
        self._add_sum_state("self_a", (layers_a, dim_a, dim_a))
        self._add_sum_state("self_b", (layers_b, dim_b, dim_b))
        cross = (layers_a, dim_a, dim_b) if pairs == "diagonal" else (layers_a * dim_a, layers_b * dim_b)
        self._add_sum_state("cross", cross)
        self._add_shift_state((1, layers_a * dim_a + layers_b * dim_b))

    def update(self, a: Tensor, b: Tensor) -> None:
        """Accumulate the features of the same N tokens from both models."""
        _check_pair(a, b)
        if tuple(a.shape[::2]) != (self.layers_a, self.dim_a) or tuple(b.shape[::2]) != (self.layers_b, self.dim_b):
            raise ValueError(
                f"Expected features ({self.layers_a}, N, {self.dim_a}) and ({self.layers_b}, N, {self.dim_b}), got "
                f"{tuple(a.shape)} and {tuple(b.shape)}."
            )
        n = a.shape[1]
        if n == 0:
            return
        a, b = a.to(self.cross.device), b.to(self.cross.device)
        if not self._has_shift:
            means = [a.to(torch.float64).mean(dim=1).reshape(-1), b.to(torch.float64).mean(dim=1).reshape(-1)]
            self._take_shift(torch.cat(means).unsqueeze(0))
        split = self.layers_a * self.dim_a
        dtype = self._product_dtype(a.dtype, b.dtype)
        shift = self.shift[0].to(self.cross.device)
        flat_a, flat_b = _rows_minus(a, shift[:split], dtype), _rows_minus(b, shift[split:], dtype)  # (N, L d)
        self.count += n
        self.sum_a += flat_a.sum(dim=0, dtype=torch.float64).view(self.layers_a, self.dim_a)
        self.sum_b += flat_b.sum(dim=0, dtype=torch.float64).view(self.layers_b, self.dim_b)
        x = flat_a.view(n, self.layers_a, self.dim_a).transpose(0, 1)  # (L_A, N, d_A), a view
        y = flat_b.view(n, self.layers_b, self.dim_b).transpose(0, 1)
        if dtype != torch.float64:
            self._add_low_precision_products(x, y, flat_a, flat_b)
            return
        # In place, straight into the float64 states (the same sums as _cross_cka_update, without a (L_A d_A, L_B d_B)
        # temporary: the cross moment is the bulk of the work and of the memory).
        self.self_a.baddbmm_(x.transpose(1, 2), x)
        self.self_b.baddbmm_(y.transpose(1, 2), y)
        if self.pairs == "diagonal":
            self.cross.baddbmm_(x.transpose(1, 2), y)
        else:
            self.cross.addmm_(flat_a.T, flat_b)

    def _product_dtype(self, a: torch.dtype, b: torch.dtype) -> torch.dtype:
        """float64 when exact; when fast, the features' dtype widened to at least float32.

        bfloat16 products would round every centred value to 8 significant bits, too coarse for the stated error.
        """
        if self.precision == "exact":
            return torch.float64
        return torch.promote_types(torch.promote_types(a, b), torch.float32)

    def _add_low_precision_products(self, x: Tensor, y: Tensor, flat_a: Tensor, flat_b: Tensor) -> None:
        """``precision="fast"``: this batch's moments as float32 products, added to the float64 states.

        Every product is written into one scratch buffer kept from batch to batch (see :meth:`_scratch`). The cross
        moment goes in blocks of ``_FAST_ROWS`` rows, so that buffer stays at ``_FAST_ROWS x L_B d_B`` values (a
        (L_A d_A, L_B d_B) temporary would add 340 MiB at GPT-2-small's shape).
        """
        for moment, z in ((self.self_a, x), (self.self_b, y)):
            moment += torch.bmm(z.transpose(1, 2), z, out=self._scratch(moment.shape, z))
        if self.pairs == "diagonal":
            self.cross += torch.bmm(x.transpose(1, 2), y, out=self._scratch(self.cross.shape, x))
            return
        rows = flat_a.T
        for start in range(0, rows.shape[0], _FAST_ROWS):
            block = rows[start : start + _FAST_ROWS]
            self.cross[start : start + _FAST_ROWS] += torch.mm(
                block, flat_b, out=self._scratch((block.shape[0], flat_b.shape[1]), flat_b)
            )

    def _scratch(self, shape: Sequence[int], like: Tensor) -> Tensor:
        """An uninitialised ``shape`` view of one buffer of ``like``'s dtype and device, reused by every batch.

        On a CPU a fresh product of tens of MB is a fresh mapping of memory, whose every page the kernel zeroes on
        first touch: at GPT-2-small's shape the cross products of a 512-token batch took 0.64-0.90 s into fresh
        tensors against 0.54-0.58 s into one buffer (2-core VM, two runs). The buffer is a plain attribute, not a
        state (never synchronised or saved), dropped by :meth:`reset`.
        """
        numel = math.prod(shape)
        buffer = self._buffer
        if buffer is None or buffer.numel() < numel or buffer.dtype != like.dtype or buffer.device != like.device:
            block = min(_FAST_ROWS, self.layers_a * self.dim_a) * self.layers_b * self.dim_b
            numel_all = max(numel, block if self.pairs == "all" else 0)
            buffer = self._buffer = torch.empty(numel_all, dtype=like.dtype, device=like.device)
        return buffer[:numel].view(shape)

    def reset(self) -> None:
        """Zero the states and drop the scratch buffer of ``precision="fast"``."""
        super().reset()
        self._buffer = None

    def compute(self) -> Tensor:
        """CKA (L_A, L_B) float64."""
        return _cross_cka_compute({name: getattr(self, name) for name in self.sum_state_names})

    def compute_measures(
        self, measures: Sequence[str], svcca_variance: float = 0.99, alpha: float = 0.5, spectrum: str = "singular"
    ) -> dict[str, Tensor]:
        """The second-moment measures across the models from the same sums (``functional_family``), on all tokens.

        Every measure of ``functional_family.MEASURES`` but ``debiased_cka``: ``{name: (L_A, L_B)}``, and for
        ``effective_rank`` ``effective_rank_a`` (L_A,) and ``effective_rank_b`` (L_B,).
        """
        names = check_cross_measures(measures, svcca_variance, alpha)
        states = {name: getattr(self, name) for name in self.sum_state_names}
        return cross_model_measures(states, names, svcca_variance, alpha, spectrum)

    def _sample_count(self, states: dict[str, Tensor]) -> Tensor:
        return states["count"]

    def _recentred(self, states: dict[str, Tensor], delta: Tensor) -> dict[str, Tensor]:
        split = self.layers_a * self.dim_a
        delta = delta.reshape(-1).to(states["cross"])
        flat_a, flat_b = delta[:split], delta[split:]
        da, db = flat_a.view(self.layers_a, self.dim_a), flat_b.view(self.layers_b, self.dim_b)
        n, ma, mb = states["count"], states["sum_a"], states["sum_b"]

        def own(moment: Tensor, m: Tensor, d: Tensor) -> Tensor:
            outer = torch.einsum("ld,le->lde", m, d)
            return moment + outer + outer.transpose(1, 2) + n * torch.einsum("ld,le->lde", d, d)

        if self.pairs == "diagonal":
            cross = states["cross"] + torch.einsum("ld,le->lde", ma, db) + torch.einsum("ld,le->lde", da, mb)
            cross = cross + n * torch.einsum("ld,le->lde", da, db)
        else:
            cross = states["cross"] + torch.outer(ma.reshape(-1), flat_b) + torch.outer(flat_a, mb.reshape(-1))
            cross = cross + n * torch.outer(flat_a, flat_b)
        return {
            "count": n,
            "sum_a": ma + n * da,
            "sum_b": mb + n * db,
            "self_a": own(states["self_a"], ma, da),
            "self_b": own(states["self_b"], mb, db),
            "cross": cross,
        }


class MinibatchCrossCKA(_SumStateMetric):
    """Unbiased minibatch CKA across models over contiguous chunks of ``chunk`` tokens, both aggregations.

    Tokens are buffered (at most ``chunk`` of them, (L_A d_A + L_B d_B) floats each) until a chunk is full; the
    HSIC of every full chunk is summed into float64 states (``across_sum`` (L_A, L_B), ``self_a_sum`` (L_A,),
    ``self_b_sum`` (L_B,), ``cka_sum`` (L_A, L_B), ``num_chunks``). ``compute`` also counts the tokens left in the
    buffer as one last chunk when there are at least 4 (without consuming them). The value depends on how tokens
    fall into chunks, so it differs between DDP world sizes (each rank chunks its own tokens); ``CrossModelCKA`` is
    the exact one.

    Shapes:
        ``update(a, b)`` as for ``CrossModelCKA``. ``compute()``: ``{"mean": (L_A, L_B), "sum": (L_A, L_B)}``, the
        paper's mean of per-chunk CKAs and Nguyen et al.'s ratio of HSIC sums.
    """

    def __init__(self, layers_a: int, layers_b: int, chunk: int = 1024, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.layers_a = _check_positive_int("layers_a", layers_a)
        self.layers_b = _check_positive_int("layers_b", layers_b)
        self.chunk = _check_positive_int("chunk", chunk)
        if chunk < 4:
            raise ValueError(f"Expected `chunk` >= 4 (the unbiased HSIC needs 4 tokens), got {chunk}.")
        self._add_sum_state("across_sum", (layers_a, layers_b))
        self._add_sum_state("self_a_sum", (layers_a,))
        self._add_sum_state("self_b_sum", (layers_b,))
        self._add_sum_state("cka_sum", (layers_a, layers_b))
        self._add_sum_state("num_chunks", ())
        self._pending: list[tuple[Tensor, Tensor]] = []
        self._num_pending = 0

    def reset(self) -> None:
        super().reset()
        self._pending, self._num_pending = [], 0

    def update(self, a: Tensor, b: Tensor) -> None:
        """Add the features of the same N tokens from both models; full chunks are consumed at once."""
        _check_pair(a, b)
        if a.shape[0] != self.layers_a or b.shape[0] != self.layers_b:
            raise ValueError(f"Expected {self.layers_a} and {self.layers_b} layers, got {a.shape[0]} and {b.shape[0]}.")
        if a.shape[1] == 0:
            return
        self._pending.append((a.detach(), b.detach()))
        self._num_pending += a.shape[1]
        while self._num_pending >= self.chunk:
            a_all = torch.cat([x for x, _ in self._pending], dim=1)
            b_all = torch.cat([y for _, y in self._pending], dim=1)
            self._add_chunk(a_all[:, : self.chunk], b_all[:, : self.chunk])
            self._pending = [(a_all[:, self.chunk :], b_all[:, self.chunk :])]
            self._num_pending -= self.chunk

    def _chunk_sums(self, a: Tensor, b: Tensor) -> tuple[Tensor, ...]:
        across, self_a, self_b = chunk_hsic(a, b)
        return across, self_a, self_b, across / torch.sqrt(torch.outer(self_a, self_b))

    def _add_chunk(self, a: Tensor, b: Tensor) -> None:
        across, self_a, self_b, cka = (value.to(self.across_sum.device) for value in self._chunk_sums(a, b))
        self.across_sum += across
        self.self_a_sum += self_a
        self.self_b_sum += self_b
        self.cka_sum += cka
        self.num_chunks += 1

    def compute(self) -> dict[str, Tensor]:
        across, self_a, self_b = self.across_sum, self.self_a_sum, self.self_b_sum
        cka, chunks = self.cka_sum, self.num_chunks
        if self._num_pending >= 4:
            a = torch.cat([x for x, _ in self._pending], dim=1)
            b = torch.cat([y for _, y in self._pending], dim=1)
            extra = [value.to(across.device) for value in self._chunk_sums(a, b)]
            across, self_a, self_b, cka = across + extra[0], self_a + extra[1], self_b + extra[2], cka + extra[3]
            chunks = chunks + 1
        elif self._num_pending:
            rank_zero_warn(
                f"MinibatchCrossCKA: the last {self._num_pending} tokens (< 4) form no chunk; left out.",
                LayerwiseWarning,
            )
        return {"mean": cka / chunks, "sum": across / torch.sqrt(torch.outer(self_a, self_b))}


def _rows_minus(features: Tensor, shift: Tensor, dtype: torch.dtype) -> Tensor:
    """(N, L d) token rows of ``features`` (L, N, d) minus ``shift`` (L d,), in ``dtype``.

    Subtracted in float64 and rounded once, in one pass: no float64 copy of the features is made.
    """
    layers, n, dim = features.shape
    rows = torch.empty(n, layers, dim, dtype=dtype, device=features.device)
    torch.sub(features.transpose(0, 1), shift.view(1, layers, dim), out=rows)
    return rows.view(n, layers * dim)
