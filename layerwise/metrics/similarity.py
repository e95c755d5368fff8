"""Representation-similarity metrics between layers: COS, saturation COS, exact linear CKA and minibatch CKA."""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, Optional

import torch
from torch import Tensor
from torchmetrics.utilities import rank_zero_warn

from layerwise.errors import LayerwiseWarning
from layerwise.metrics._base import _check_positive_int, _ShiftedSumStateMetric, _SumStateMetric
from layerwise.metrics.functional import _check_features
from layerwise.metrics.functional_distribution import counted_fraction
from layerwise.metrics.functional_family import (
    _block_cka_compute,
    _block_debiased_cka_compute,
    _block_moments_update,
    _block_norm_product_update,
    _debiased_cka_compute,
    _norm_product_update,
    _recentred_blocks,
    _recentred_norm_products,
    check_measures,
    check_pairs,
    kept_blocks,
    second_moment_measures,
)
from layerwise.metrics.functional_similarity import (
    _cosine_compute,
    _cosine_distribution_update,
    _cosine_update,
    _feature_sum_update,
    _linear_cka_compute,
    _linear_cka_update,
    _minibatch_cka_compute,
    _minibatch_hsic_update,
    _recentred_moments,
    _saturation_cosine_compute,
    _saturation_cosine_update,
    _saturation_pairs,
    _unit,
    layer_cosine_similarity,
    linear_cka,
    saturation_cosine,
)


class _CenteredBufferMetric(_SumStateMetric):
    """Shared machinery of the centered cosine metrics.

    A per-sample cosine of *centred* vectors is not a function of additive statistics: the center (the mean over
    all N samples, on all ranks) is only known at the end. So each rank keeps a copy of what it needs, in the
    inputs' own dtype so that nothing is rounded before the float64 centering (a plain list, not a torchmetrics
    state: it is never gathered) plus a float64 ``feature_sum`` (L, d) state for
    the mean. ``compute`` centres the buffer on the global mean and sums the local cosines over ranks with one
    extra ``all_reduce`` — hence ``compute`` is a collective under DDP. If a rank's buffer would exceed
    ``max_buffered_samples``, the rank freezes the center at the mean of the samples it has seen so far, folds the
    buffer into the streamed ``cos_sum`` state and streams the rest with that fixed center (approximate).
    """

    feature_sum: Tensor  # a sum state, reassigned while the width is unknown

    def __init__(self, num_layers: int, center: bool, max_buffered_samples: int, dim: Optional[int], **kwargs: Any):
        super().__init__(**kwargs)
        self.num_layers = _check_positive_int("num_layers", num_layers)
        if not isinstance(center, bool):
            raise ValueError(f"Expected `center` to be a bool, got {center!r}.")
        self.center = center
        self.max_buffered_samples = _check_positive_int("max_buffered_samples", max_buffered_samples)
        self.dim = None if dim is None else _check_positive_int("dim", dim)
        if center:
            # (L, 0) until the width is known: pass `dim` to allocate it eagerly (see the class docstring on DDP).
            self._add_sum_state("feature_sum", (num_layers, self.dim or 0))
            self._add_sum_state("num_samples", ())
        self._buffer: list[tuple[Tensor, ...]] = []
        self._num_buffered = 0
        self._frozen_center: Optional[Tensor] = None
        self._overflow_warned = False

    def reset(self) -> None:
        """Reset the states and free the buffer."""
        super().reset()
        self._buffer = []
        self._num_buffered = 0
        self._frozen_center = None

    def merge_state(self, incoming_state: Any) -> None:
        """Merge states of another instance; not possible for the centered variant, whose buffer is no state."""
        if self.center:
            raise NotImplementedError("merge_state is not supported with center=True (the sample buffer is no state).")
        super().merge_state(incoming_state)

    def _accumulate_mean(self, features: Tensor) -> None:
        """Add the batch to the (lazily sized) per-layer sum used for the global mean."""
        feature_sum, batch_size = _feature_sum_update(features, self.num_layers, self.dim)
        if self.feature_sum.shape[1] == 0:
            self.dim = feature_sum.shape[1]
            self.feature_sum = torch.zeros_like(feature_sum)
        self.feature_sum += feature_sum
        self.num_samples += batch_size

    def _buffer_or_stream(self, batch_size: int, entry: tuple[Tensor, ...]) -> None:
        """Buffer a batch (``entry``: detached tensors the metric may keep), or stream it with the frozen center."""
        if self._frozen_center is None and self._num_buffered + batch_size > self.max_buffered_samples:
            if not self._overflow_warned:
                rank_zero_warn(
                    f"{type(self).__name__}: more than max_buffered_samples={self.max_buffered_samples} samples on"
                    " this rank; freezing the center at the mean of the samples seen so far and streaming the rest."
                    " The centered result is now approximate (and not identical across DDP world sizes)."
                    " Raise `max_buffered_samples` for the exact value.",
                    LayerwiseWarning,
                )
                self._overflow_warned = True
            self._frozen_center = self.feature_sum / self.num_samples  # rank-local: update never sees synced states
            for buffered in self._buffer:
                self._stream(buffered, self._frozen_center)
            self._buffer, self._num_buffered = [], 0
        if self._frozen_center is not None:
            self._stream(entry, self._frozen_center)
        else:
            self._buffer.append(entry)
            self._num_buffered += batch_size

    # The states that ``_centered_stats`` returns, in its order; the buffer's part is added to them at compute.
    _streamed: tuple[str, ...] = ("cos_sum", "count")

    def _buffered_stats(self) -> tuple[Tensor, ...]:
        """The streamed states plus the buffered samples centred on the global mean, summed over ranks if global."""
        center = self.feature_sum / self.num_samples
        local = [torch.zeros_like(getattr(self, name)) for name in self._streamed]
        for chunk in self._chunks():
            for total, part in zip(local, self._centered_stats(*chunk, center=center)):
                total += part
        flat = torch.cat([part.flatten() for part in local])  # one all-reduce for every state
        self._all_reduce_if_global(flat)
        parts = flat.split([part.numel() for part in local])
        return tuple(
            getattr(self, name) + part.view_as(getattr(self, name)) for name, part in zip(self._streamed, parts)
        )

    # Where the samples run in each tensor of a buffered entry, and how many float64 bytes of per-sample work one
    # pass of ``_centered_stats`` may hold (the buffered batches are joined up to this size at compute time: one
    # pass per chunk instead of one per batch, i.e. a few kernel launches instead of thousands on a GPU).
    _sample_dims: tuple[int, ...] = (1,)
    _CHUNK_BYTES = 64 * 2**20

    def _chunks(self) -> Iterator[tuple[Tensor, ...]]:
        """The buffer's entries joined, in order, into chunks of at most ``_CHUNK_BYTES`` of float64 features."""
        if not self._buffer:
            return
        first = self._buffer[0][0]
        bytes_per_sample = 8 * max(1, first.numel() // max(1, first.shape[self._sample_dims[0]]))
        rows = max(1, self._CHUNK_BYTES // bytes_per_sample)
        group: list[tuple[Tensor, ...]] = []
        size = 0
        for entry in self._buffer:
            batch = entry[0].shape[self._sample_dims[0]]
            if group and size + batch > rows:
                yield self._join(group)
                group, size = [], 0
            group.append(entry)
            size += batch
        yield self._join(group)

    def _join(self, group: list[tuple[Tensor, ...]]) -> tuple[Tensor, ...]:
        if len(group) == 1:
            return group[0]
        return tuple(torch.cat(parts, dim=dim) for parts, dim in zip(zip(*group), self._sample_dims, strict=True))

    def _stream(self, entry: tuple[Tensor, ...], center: Tensor) -> None:
        for name, part in zip(self._streamed, self._centered_stats(*entry, center=center)):
            getattr(self, name).add_(part)

    @abc.abstractmethod
    def _centered_stats(self, *entry: Tensor, center: Tensor) -> tuple[Tensor, ...]:
        """The ``_streamed`` statistics of one buffered entry with a given center."""


class LayerCosineSimilarity(_CenteredBufferMetric):
    r"""Mean cosine similarity between the representations of every pair of layers (COS matrix).

    .. math:: C[a, b] = \frac{1}{N} \sum_i \cos(h_i^a - \mu^a, h_i^b - \mu^b)

    with :math:`\mu^l` the mean of layer l over all N samples of the epoch (all ranks); ``center=False`` drops
    :math:`\mu`. A sample whose vector is zero at a layer (on the center) has no direction and is left out of
    that layer's pairs; a pair where no sample is left (a constant layer) is NaN, written as null.

    The uncentered variant streams exactly: per sample, normalise, and sum :math:`U_i U_i^T` (states ``cos_sum``
    (L, L), ``count``). The centered variant cannot be streamed (the per-sample norm is taken *after*
    centering on the final mean): every rank keeps its features in a buffer of the inputs' dtype, ``L * d * b``
    bytes per sample for b-byte floats (37 kB for 12 x 768 in float32, so 2.4 GB at the default
    ``max_buffered_samples=65536``; half that for bf16/fp16 features, twice for float64), on the device of the
    inputs. Centering and cosines are float64, so a common offset of 1e6 loses nothing.
    Beyond ``max_buffered_samples`` samples on a rank, a warning is raised once and the rank freezes the center at
    the mean of the samples it has seen, folds its buffer into ``cos_sum`` and streams the rest: the result is then
    an approximation, close when the early mean is a good estimate of the final one, and it depends on how the data
    are split across ranks.

    DDP: ``compute`` of the centered variant is a collective (it all-reduces the L x L cosine sum of the buffers
    once the global mean is known) whenever its states are global, i.e. after torchmetrics' ``sync_on_compute`` or
    after ``all_reduce_sum_states``; call it on every rank. With rank-local states it stays local. Under DDP, pass
    ``dim`` (or make sure every rank sees at least one batch, as ``DistributedSampler`` does): otherwise a rank
    without data holds a (L, 0) ``feature_sum`` and the reduction fails. ``forward`` accumulates like ``update``
    and returns the value on the batch alone (centred on the batch mean), without communication.

    Distribution (``bins > 0``, App. B.1 of Jiang et al.): the mean hides the rare samples whose representations
    at far apart layers point in opposite directions. Then the metric also sums a histogram of the per-sample
    cosines of every layer pair on [-1, 1] with ``bins`` fixed bins (states ``histogram`` (L, L, bins), exact and
    summed like the others) and the exact count of negative cosines (``negative`` (L, L)).
    ``compute_distribution`` returns them with the mean; quantiles read from the histogram
    (``functional_distribution.histogram_quantiles``) are within half a bin width, 1 / bins, of the exact ones.

    Args:
        num_layers: L.
        center: subtract the per-layer mean before the cosine.
        max_buffered_samples: per-rank buffer limit of the centered variant (see above).
        dim: feature width d; optional, allocates the mean state eagerly.
        bins: number of histogram bins on [-1, 1]; 0 (default) keeps no distribution.
        kwargs: torchmetrics ``Metric`` options (``sync_on_compute``, ``process_group``, ...).

    Shapes:
        ``update(features)``: features (L, B, d), any float dtype. ``compute()``: (L, L) float64.
        ``compute_distribution()``: ``CosineDistribution`` of (L, L) mean, (L, L, bins) histogram, (L, L)
        fraction of negative cosines.
    """

    def __init__(
        self,
        num_layers: int,
        center: bool = True,
        max_buffered_samples: int = 65536,
        dim: Optional[int] = None,
        bins: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(num_layers, center, max_buffered_samples, dim, **kwargs)
        if not isinstance(bins, int) or isinstance(bins, bool) or bins < 0:
            raise ValueError(f"Expected `bins` to be a non-negative int (0: no histogram), got {bins!r}.")
        self.bins = bins
        self._add_sum_state("cos_sum", (num_layers, num_layers))
        self._add_sum_state("count", (num_layers, num_layers))
        if bins:
            self._add_sum_state("histogram", (num_layers, num_layers, bins))
            self._add_sum_state("negative", (num_layers, num_layers))
            self._streamed = ("cos_sum", "count", "histogram", "negative")

    def update(self, features: Tensor) -> None:
        """Accumulate a batch of features (L, B, d)."""
        if not self.center:
            for name, part in zip(self._streamed, self._stats(features, None)):
                getattr(self, name).add_(part)
            return
        self._accumulate_mean(features)
        self._buffer_or_stream(features.shape[1], (features.detach().clone(),))

    def forward(self, features: Tensor) -> Tensor:
        """Accumulate the batch like ``update`` and return the COS matrix (L, L) of this batch alone."""
        if not self.center:
            return super().forward(features)
        self.update(features)
        self._forward_cache = layer_cosine_similarity(features, center=True)
        return self._forward_cache

    def compute(self) -> Tensor:
        """Return the COS matrix (L, L) float64. A collective for the centered variant with global states."""
        return _cosine_compute(*self._totals()[:2])

    def compute_distribution(self) -> CosineDistribution:
        """The mean COS, the histogram and the fraction of negative cosines, with one collective (see ``compute``)."""
        if not self.bins:
            raise ValueError("compute_distribution needs a histogram: construct the metric with `bins` > 0.")
        # torchmetrics syncs only around `compute`: the same public context manager gives this method its sync
        with self.sync_context(dist_sync_fn=self.dist_sync_fn, should_sync=self.sync_on_compute):
            cos_sum, count, histogram, negative = (value.clone() for value in self._totals())
        return CosineDistribution(_cosine_compute(cos_sum, count), histogram, counted_fraction(negative, histogram))

    def _totals(self) -> tuple[Tensor, ...]:
        if not self.center:
            return tuple(getattr(self, name) for name in self._streamed)
        return self._buffered_stats()

    def _stats(self, features: Tensor, center: Optional[Tensor]) -> tuple[Tensor, ...]:
        if self.bins:
            return _cosine_distribution_update(features, self.num_layers, self.bins, center=center)
        return _cosine_update(features, self.num_layers, center=center)

    def _centered_stats(self, features: Tensor, center: Tensor) -> tuple[Tensor, ...]:  # type: ignore[override]
        """The streamed statistics of one buffered batch with a given center."""
        return self._stats(features, center)


class CosineDistribution(NamedTuple):
    """What ``LayerCosineSimilarity.compute_distribution`` returns."""

    mean: Tensor
    histogram: Tensor
    negative_fraction: Tensor


class SaturationCosine(_CenteredBufferMetric):
    r"""Similarity of a sample's representation at its saturation layer to its final representation.

    For every layer l: the mean over the samples whose saturation layer (see ``saturation_layers``) is l of
    :math:`\cos(h_i^l - \mu^l, h_i^L - \mu^L)`, :math:`\mu^l` the mean of layer l over *all* samples; NaN where no
    sample saturates at l; the entry of the last layer is 1 by construction.

    ``center=False`` streams exactly (states ``cos_sum`` (L,), ``count`` (L,)). ``center=True`` buffers per sample
    only :math:`(h_i^{s_i}, h_i^L, s_i)` (in the inputs' dtype, ``2 * d * b + 8`` bytes) plus the (L, d) float64
    sum state for the means, with the same ``max_buffered_samples`` fallback, collective ``compute`` and
    ``dim``/``forward`` notes as ``LayerCosineSimilarity``.

    Args:
        num_layers: L.
        center: subtract the per-layer means before the cosine.
        max_buffered_samples: per-rank buffer limit of the centered variant.
        dim: feature width d; optional, allocates the mean state eagerly.
        kwargs: torchmetrics ``Metric`` options.

    Shapes:
        ``update(features, saturation)``: features (L, B, d), saturation (B,) 0-based long.
        ``compute()``: (L,) float64.
    """

    def __init__(
        self,
        num_layers: int,
        center: bool = True,
        max_buffered_samples: int = 65536,
        dim: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(num_layers, center, max_buffered_samples, dim, **kwargs)
        self._add_sum_state("cos_sum", (num_layers,))
        self._add_sum_state("count", (num_layers,))

    _sample_dims = (0, 0, 0)  # buffered entries: h^{s_i} (B, d), h^L (B, d), s (B,)

    def update(self, features: Tensor, saturation: Tensor) -> None:
        """Accumulate features (L, B, d) with the 0-based saturation layer (B,) of every sample."""
        selected, last = _saturation_pairs(features, saturation, self.num_layers)
        if not self.center:
            cos_sum, count = _saturation_cosine_update(selected, last, saturation, self.num_layers)
            self.cos_sum += cos_sum
            self.count += count
            return
        self._accumulate_mean(features)
        saturation = saturation.detach().to(device=features.device, dtype=torch.long, copy=True)
        entry = (selected.detach().clone(), last.detach().clone(), saturation)
        self._buffer_or_stream(features.shape[1], entry)

    def forward(self, features: Tensor, saturation: Tensor) -> Tensor:
        """Accumulate the batch like ``update`` and return the (L,) value of this batch alone."""
        if not self.center:
            return super().forward(features, saturation)
        self.update(features, saturation)
        self._forward_cache = saturation_cosine(features, saturation, center=True)
        return self._forward_cache

    def compute(self) -> Tensor:
        """Return the mean cosine per saturation layer (L,) float64. A collective when centered with global states."""
        if not self.center:
            return _saturation_cosine_compute(self.cos_sum, self.count)
        return _saturation_cosine_compute(*self._buffered_stats())

    def _centered_stats(  # type: ignore[override]  # its own entries, as the base's *entry allows
        self, selected: Tensor, last: Tensor, saturation: Tensor, center: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Cosine sum and count per saturation layer (L,) of one buffered batch with a given center."""
        return _saturation_cosine_update(selected, last, saturation, self.num_layers, center=center)


class LayerCKA(_ShiftedSumStateMetric):
    r"""Exact linear CKA (Kornblith et al., 2019) between every pair of layers, streamed over the epoch.

    .. math:: \mathrm{CKA}(a, b) = \frac{\|X_a^T X_b\|_F^2}{\|X_a^T X_a\|_F \, \|X_b^T X_b\|_F}

    with :math:`X_l` the column-centred (N, d) features of layer l over all N samples. States (float64, summed):
    ``feature_sum`` (L, d), ``cross`` = :math:`Z^T Z` (L*d, L*d) for the stacked features
    :math:`Z = [h^1 \dots h^L]` (one float64 matmul per batch, added in place), ``count``. ``compute`` centres
    (K = S - n mu mu^T) and takes blockwise squared Frobenius norms. The sums are of ``h - shift``, ``shift``
    (L, d) the mean of the first batch of each rank, re-aligned across ranks before any reduction (see
    ``_ShiftedSumStateMetric``): a common offset of 1e6 costs no digits (raw moments would lose 12 of 16). All
    layers must share the width d.

    When to use which CKA: this one is exact, independent of batching and identical under DDP (sum states), but
    its state is (L*d)^2 * 8 bytes: 680 MB for 12 x 768 (ViT-B/16, BERT-base; 797 MB with the embedding
    output, 13 x 768), 4.8 GB for 24 x 1024 (ViT-L, BERT-large), plus one d x L*d block row during ``compute``
    and, with torchmetrics' default gather-based sync, world-size copies of it (prefer ``all_reduce_sum_states``).
    Each update costs 2 * B * (L*d)^2 float64 FLOPs (43 GFLOP for B=256 at 12 x 768), which is slow on GPUs with
    weak float64. ``MinibatchCKA`` needs O(L^2) state but is an estimator whose value depends on the batches.

    The same states give the other second-moment measures on the whole set (``compute_measures``: mean CCA, SVCCA,
    PWCCA, the Procrustes distance, netrep's angular shape metric, the effective rank of each layer; the math in
    :mod:`~layerwise.metrics.functional_family`). ``debiased=True`` adds the two sums debiased CKA needs (Song et
    al.'s unbiased HSIC, exact on all N, not the minibatch estimator): ``norm_products`` (L, L) and
    ``weighted_sums`` (L, L, d), 8 L^2 (d + 1) bytes (0.9 MB for 12 x 768); ``compute_measures`` then also gives
    ``debiased_cka``.

    Some pairs only (``pairs="to_last"``: (l, L) for every l; ``"adjacent"``: (l, l + 1)): instead of ``cross`` the
    metric keeps ``blocks`` (K, d, d), the (d, d) blocks S_ab of the K = 2L - 1 pairs a <= b it needs (every
    diagonal block and the L - 1 pairs), so 8 (2L - 1) d^2 bytes, O(L d^2) instead of O(L^2 d^2): 109 MB instead of
    680 MB for 12 x 768, 394 MB instead of 4.8 GB for 24 x 1024; with ``debiased``, Q (K,) and R (K, 2, d). The
    same float64 sums around the same shift, reduced the same way: at the kept pairs every value equals the
    ``"all"`` metric's; ``compute`` and ``compute_measures`` give NaN at the other pairs (CKA at both orders of a
    kept pair and on the diagonal).

    Args:
        num_layers: L.
        dim: feature width d.
        debiased: also keep the sums of debiased CKA.
        pairs: ``"all"`` (default), ``"to_last"`` or ``"adjacent"``: the layer pairs whose blocks are kept.
        kwargs: torchmetrics ``Metric`` options.

    Shapes:
        ``update(features)``: (L, B, dim). ``compute()``: (L, L) float64 (NaN for a constant layer).
        ``compute_measures(measures)``: ``{name: (L, L)}``, ``effective_rank`` (L,).
    """

    cross: Tensor  # a sum state, reassigned by update
    blocks: Tensor  # the same with some pairs only

    def __init__(self, num_layers: int, dim: int, debiased: bool = False, pairs: str = "all", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_layers = _check_positive_int("num_layers", num_layers)
        self.dim = _check_positive_int("dim", dim)
        if not isinstance(debiased, bool):
            raise ValueError(f"Expected `debiased` to be a bool, got {debiased!r}.")
        self.debiased = debiased
        self.pairs = check_pairs(pairs)
        self.kept_blocks = kept_blocks(pairs, num_layers)  # None: the stacked moments of every pair
        kept = self.kept_blocks
        self._add_sum_state("feature_sum", (num_layers, dim))
        if kept is None:
            self._add_sum_state("cross", (num_layers * dim, num_layers * dim))
        else:
            self._add_sum_state("blocks", (len(kept), dim, dim))
        self._add_sum_state("count", ())
        if debiased:
            self._add_sum_state("norm_products", (num_layers, num_layers) if kept is None else (len(kept),))
            self._add_sum_state("weighted_sums", (num_layers, num_layers, dim) if kept is None else (len(kept), 2, dim))

        self._add_shift_state((num_layers, dim))

    def update(self, features: Tensor) -> None:
        """Accumulate a batch of features (L, B, d)."""
        _check_features(features, self.num_layers, self.dim)
        shifted = self._shifted(features)
        if self.kept_blocks is not None:
            _block_moments_update(shifted, self.kept_blocks, self.blocks)
            self.feature_sum += shifted.sum(dim=1)
            self.count += shifted.shape[1]
            if self.debiased:
                norm_products, weighted_sums = _block_norm_product_update(shifted, self.kept_blocks)
                self.norm_products += norm_products
                self.weighted_sums += weighted_sums
            return
        feature_sum, self.cross, batch_size = _linear_cka_update(shifted, self.num_layers, self.dim, self.cross)
        self.feature_sum += feature_sum
        self.count += batch_size
        if self.debiased:
            norm_products, weighted_sums = _norm_product_update(shifted, self.num_layers)
            self.norm_products += norm_products
            self.weighted_sums += weighted_sums

    def compute_measures(
        self,
        measures: Sequence[str],
        svcca_variance: float = 0.99,
        alpha: float = 0.5,
        spectrum: str = "singular",
        pairs: Optional[Sequence[tuple[int, int]]] = None,
    ) -> dict[str, Tensor]:
        """The second-moment measures of ``measures`` (see ``functional_family.MEASURES``) on the whole set.

        ``pairs``: the (a, b) pairs to compute (default all, or all kept; the others NaN); ``svcca_variance``: the
        share of each layer's variance SVCCA keeps; ``alpha``: the shape metric's (0: CCA, 1: Procrustes);
        ``spectrum``: the effective rank on ``"singular"`` values (Roy & Vetterli, RankMe) or ``"covariance"``
        eigenvalues.
        """
        names = check_measures(measures)
        if "debiased_cka" in names and not self.debiased:
            raise ValueError("`debiased_cka` needs the metric built with `debiased=True` (its two extra sums).")
        kept = self.kept_blocks
        moments = self.cross if kept is None else self.blocks
        out = second_moment_measures(
            self.feature_sum, moments, self.count, names, svcca_variance, alpha, spectrum, pairs, blocks=kept
        )
        if "debiased_cka" in names and kept is not None:
            out["debiased_cka"] = _block_debiased_cka_compute(
                kept, self.feature_sum, self.blocks, self.count, self.norm_products, self.weighted_sums
            )
        elif "debiased_cka" in names:
            out["debiased_cka"] = _debiased_cka_compute(
                self.feature_sum, self.cross, self.count, self.norm_products, self.weighted_sums
            )
        return {name: out[name] for name in names}

    def forward(self, features: Tensor) -> Tensor:
        """Accumulate the batch like ``update`` and return the CKA matrix (L, L) of this batch alone."""
        self.update(features)
        self._forward_cache = linear_cka(features)
        return self._forward_cache

    def compute(self) -> Tensor:
        """Return the CKA matrix (L, L) float64 (with some ``pairs``: NaN at the others)."""
        if self.kept_blocks is not None:
            return _block_cka_compute(self.kept_blocks, self.feature_sum, self.blocks, self.count)
        return _linear_cka_compute(self.feature_sum, self.cross, self.count)

    def _sample_count(self, states: dict[str, Tensor]) -> Tensor:
        return states["count"]

    def _recentred(self, states: dict[str, Tensor], delta: Tensor) -> dict[str, Tensor]:
        if self.kept_blocks is not None:
            count, sums = states["count"], states["feature_sum"]
            delta = delta.to(device=sums.device, dtype=torch.float64)
            extra = (states["norm_products"], states["weighted_sums"]) if self.debiased else (None, None)
            blocks, q, r = _recentred_blocks(self.kept_blocks, count, sums, states["blocks"], delta, *extra)
            assert blocks is not None
            moved = {"count": count, "feature_sum": sums + count * delta, "blocks": blocks}
            if q is not None and r is not None:  # debiased
                moved.update(norm_products=q, weighted_sums=r)
            return moved
        moved = _recentred_moments(states, delta, count="count", sums="feature_sum", cross="cross")
        if self.debiased:  # from the old sums, before they move
            moved["norm_products"], moved["weighted_sums"] = _recentred_norm_products(
                states["count"],
                states["feature_sum"],
                states["cross"],
                states["norm_products"],
                states["weighted_sums"],
                delta,
            )
        return moved


class MinibatchCKA(_SumStateMetric):
    r"""Minibatch linear CKA with the unbiased HSIC estimator (Nguyen, Raghu & Kornblith, 2021).

    For every minibatch of n >= 4 samples, with Grams :math:`K_l = X_l X_l^T` and :math:`\tilde K` the Gram with a
    zeroed diagonal,

    .. math:: \mathrm{HSIC}_1(K, L) = \frac{1}{n(n-3)}\Big[\mathrm{tr}(\tilde K \tilde L)
        + \frac{1^T \tilde K 1 \; 1^T \tilde L 1}{(n-1)(n-2)} - \frac{2}{n-2} 1^T \tilde K \tilde L 1\Big]

    is summed over minibatches into ``hsic_sum`` (L, L) and CKA = S_ab / sqrt(S_aa S_bb). Batches with fewer than 4
    samples are skipped (one warning). The estimator is shift invariant; each batch is centred on its own mean
    before the Gram purely for numerical accuracy.

    When to use which CKA: this one needs O(L^2) state and O(L n^2) memory per batch, so it fits any model, but its
    value depends on the batch composition and size (it is not identical for different numbers of DDP processes,
    which see different batches); unbiasedness makes it converge to the population CKA, not to ``LayerCKA`` on the
    same finite set. Prefer ``LayerCKA`` when (L*d)^2 * 8 bytes fit.

    Args:
        num_layers: L.
        kwargs: torchmetrics ``Metric`` options.

    Shapes:
        ``update(features)``: (L, n, d). ``compute()``: (L, L) float64 (NaN if no batch was used).
    """

    def __init__(self, num_layers: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_layers = _check_positive_int("num_layers", num_layers)
        self._add_sum_state("hsic_sum", (num_layers, num_layers))
        self._add_sum_state("num_batches", ())
        self._small_batch_warned = False

    def update(self, features: Tensor) -> None:
        """Accumulate the unbiased HSIC of one minibatch of features (L, n, d); batches with n < 4 are skipped."""
        _check_features(features, self.num_layers)
        if features.shape[1] < 4:
            if not self._small_batch_warned:
                rank_zero_warn(
                    f"MinibatchCKA skips batches with fewer than 4 samples (got {features.shape[1]}): the unbiased"
                    " HSIC is undefined for them.",
                    LayerwiseWarning,
                )
                self._small_batch_warned = True
            return
        self.hsic_sum += _minibatch_hsic_update(features, self.num_layers)
        self.num_batches += 1

    def compute(self) -> Tensor:
        """Return the CKA matrix (L, L) float64."""
        return _minibatch_cka_compute(self.hsic_sum)


class PairedCosine(_SumStateMetric):
    r"""Mean cosine between layer a of one stack and layer b of another, over paired samples (uncentred).

    .. math:: C[a, b] = \frac{1}{N} \sum_i \cos(x_i^a, y_i^b)

    For two views of the same samples in one space, e.g. CLIP's image and caption features in the joint space
    (App. D of Jiang et al.): at the last layers this is the mean image-caption similarity CLIP is trained on.
    Exact float64 sums (``cos_sum`` (L_x, L_y), ``count``), streamed and summed across processes.

    Args:
        num_layers_x, num_layers_y: L_x, L_y.
        kwargs: torchmetrics ``Metric`` options.

    Shapes:
        ``update(x, y)``: (L_x, B, p) and (L_y, B, p). ``compute()``: (L_x, L_y) float64.
    """

    def __init__(self, num_layers_x: int, num_layers_y: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.shape = (
            _check_positive_int("num_layers_x", num_layers_x),
            _check_positive_int("num_layers_y", num_layers_y),
        )
        self._add_sum_state("cos_sum", self.shape)
        self._add_sum_state("count", ())

    def update(self, x: Tensor, y: Tensor) -> None:
        """Accumulate paired features (L_x, B, p) and (L_y, B, p)."""
        _check_features(x, self.shape[0], name="x")
        _check_features(y, self.shape[1], x.shape[-1], name="y")  # one space: the same width
        if x.shape[1] != y.shape[1]:
            raise ValueError(f"Expected paired samples, got {x.shape[1]} in `x` and {y.shape[1]} in `y`.")
        self.cos_sum += torch.einsum("abp,cbp->ac", _unit(x.to(torch.float64)), _unit(y.to(torch.float64)))
        self.count += x.shape[1]

    def compute(self) -> Tensor:
        """The (L_x, L_y) mean cosine, float64 (NaN before any sample)."""
        return torch.where(self.count > 0, self.cos_sum / self.count.clamp_min(1), torch.nan)
