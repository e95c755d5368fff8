"""COS and CKA between every pair of layers."""

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

from layerwise.analyses.base import Analysis, Metrics, Statistic, refuse_runner_options
from layerwise.analyses.layer_spec import LayerSpec, per_layer, shaped
from layerwise.engines.readout import LayerOutputs
from layerwise.errors import UsageError
from layerwise.figures.style import SIMILARITY_LABELS
from layerwise.figures.summary import similarity_figures
from layerwise.metrics import LayerCKA, LayerCosineSimilarity, LayerRowSample, MinibatchCKA
from layerwise.metrics.functional_distribution import histogram_quantiles
from layerwise.metrics.functional_family import MEASURES, check_options, check_pairs, computed_pairs
from layerwise.metrics.functional_neighbours import NEIGHBOUR_MEASURES, neighbour_measures

CKAEstimator = Literal["exact", "minibatch", "none"]
Measure = Literal[
    "debiased_cka", "cca", "svcca", "pwcca", "procrustes", "shape", "effective_rank", "mutual_knn", "cknna"
]
RankSpectrum = Literal["singular", "covariance"]
Pairs = Literal["all", "to_last", "adjacent"]


# The quantiles of the per-sample COS written to the summary (the box plots draw 0.01 ... 0.99 and the extremes).
COS_QUANTILES = (0.0, 0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99, 1.0)


class LayerSimilarityMonitor(Analysis):
    """COS and linear CKA between every pair of layers, exact over the whole evaluated set.

    COS: ``C[a,b] = (1/N) Σ_i cos(h_i^a − μ^a, h_i^b − μ^b)`` with ``μ^l`` the mean of layer ``l`` over the N
    evaluated samples (``center=False``: no centring). Because each sample's norm depends on the global mean, the
    centred COS keeps the evaluated features of this rank (in their own dtype) until the epoch ends, at most
    ``max_buffered_samples`` of them; beyond that it warns and freezes the centre at the mean of the buffered samples
    (approximate). The uncentred COS streams exactly.

    CKA (``cka="exact"``, default): linear CKA of Kornblith et al. (2019) from streamed float64 sufficient
    statistics of the stacked features, exact over all N and identical on any number of processes; its state is
    ``(L·d)²`` float64 (DeiT-S: 12·384 → 170 MB; BERT-base: 12·768 → 680 MB). For wider models use
    ``cka="minibatch"``, the unbiased minibatch HSIC estimator of Nguyen, Raghu & Kornblith (2021): O(L² + L·B²)
    memory, but an estimate whose value depends on the batch composition (so on batch size and process count).

    COS distribution (``cos_bins``, default 400; 0 switches it off): the mean hides rare samples whose
    representations at far apart layers point apart (App. B.1 of Jiang et al.). An exact histogram of the per-sample
    COS of every layer pair on [-1, 1] is summed like the other states; the quantiles read from it are within half a
    bin width (1 / cos_bins) of the exact ones, and the fraction of negative COS is exact.

    More measures (``measures``, none by default; they read the exact CKA's sums, so need ``cka="exact"``), exact
    on the whole set and identical on any number of processes (``docs/similarity-measures.md``: which published
    variant each follows): ``debiased_cka`` (Song et al.'s unbiased HSIC; two more sums, 8·L²·(d+1) bytes), ``cca``
    (mean canonical correlation), ``svcca`` (each layer on the principal directions keeping ``svcca_variance`` of
    its variance), ``pwcca`` (Morcos et al.'s weights), ``procrustes`` (Ding et al.'s distance, in [0, √2]),
    ``shape`` (netrep's angular shape distance with ``shape_alpha``: 0 = CCA, 1 = Procrustes), ``effective_rank``
    (per layer; ``rank_spectrum`` ``"singular"``: Roy & Vetterli, RankMe; ``"covariance"``: the eigenvalues). Each
    pair measure costs a few (d, d) decompositions per layer pair at the end of the validation.

    Some layer pairs only (``pairs``, default ``"all"``): ``"to_last"`` (l, L) or ``"adjacent"`` (l, l+1) computes
    the exact CKA and every measure at L pairs instead of L², NaN (null) elsewhere, and keeps only the cross-moment
    blocks they read: ``8·(2L−1)·d²`` bytes instead of ``8·(L·d)²`` (BERT-base: 109 MB instead of 680 MB), so that
    wider or deeper models fit exactly. The CKA heatmap then shows the other cells as not computed (hatched). The
    COS stays on every pair (its state is L×L). With ``"adjacent"`` the CKA's and the measures' per-layer scalars are
    each layer against the next, ``val/cka_to_next/layer_XX``, ``val/<measure>_to_next/layer_XX``.

    Neighbourhood alignment (``measures`` ``mutual_knn``, ``cknna``; any ``cka``): platonic-rep's mutual k-NN and
    CKNNA (Huh et al. 2024) with ``knn_k`` neighbours, cosine on L2-normalised features, between every pair of
    layers (``pairs`` as above). They read rows, not sums: on a seeded sample of at most ``knn_sample_size``
    evaluated samples, chosen by a seeded hash of each sample's global (dataset) index (``knn_seed``), so the same
    rows, and the same values, for any batch size and number of processes. Memory: ``8·L·knn_sample_size·d`` bytes
    per rank (12 × 768 at 1024: 75 MB), at the end twice ``8·L·knn_sample_size²`` (the kernels and masks) and, under
    DDP, the ranks' samples gathered once. One row per sample: a classifier's pooled features, not a language
    model's tokens (refused in one line), with a sequential or ``DistributedSampler`` evaluation loader.

    Logged: ``val/cos_to_last/layer_XX``, ``val/cka_to_last/layer_XX``, ``val/cos_negative_to_last/layer_XX``, and
    ``val/<measure>_to_last/layer_XX`` (``val/effective_rank/layer_XX``) for each of ``measures``; images
    ``val/cos``, ``val/cka``, ``val/<measure>``, ``val/cos_distribution`` (box plots of COS(h_l, h_L) per layer).
    JSON keys: ``cos``, ``cka`` (L x L); with the distribution ``cos_quantile_levels`` (Q), ``cos_quantiles``
    (L x L x Q), ``cos_negative_fraction`` (L x L) and ``cos_histogram_to_last`` (L x cos_bins counts of
    COS(h_l, h_L) on [-1, 1]); each of ``measures`` under its name (L x L; ``effective_rank`` L) with the options
    under ``measure_options``.
    """

    name = "similarity"
    provides = ("cos", "cka")
    figures = staticmethod(similarity_figures)
    # Options it took before, and where each went: the errors of Python and the command line name it
    moved_options: ClassVar[dict[str, str]] = {
        "measure_pairs": "renamed `pairs` (the same values), which also keeps the CKA's state to those pairs",
    }

    def __init__(
        self,
        center: bool = True,
        cka: CKAEstimator = "exact",
        max_buffered_samples: int = 65536,
        cos_bins: int = 400,
        measures: Sequence[Measure] = (),
        svcca_variance: float = 0.99,
        shape_alpha: float = 0.5,
        rank_spectrum: RankSpectrum = "singular",
        pairs: Pairs = "all",
        knn_k: int = 10,
        knn_sample_size: int = 1024,
        knn_seed: int = 0,
        **refused: Any,
    ) -> None:
        if "measure_pairs" in refused:  # its name until the state followed the pairs (issue 50)
            value = refused["measure_pairs"]
            raise ValueError(
                f"LayerSimilarityMonitor(measure_pairs={value!r}): {self.moved_options['measure_pairs']}: "
                f"give pairs={value!r}."
            )
        refuse_runner_options(type(self).__name__, refused)
        if cka not in ("exact", "minibatch", "none"):
            raise ValueError(f"`cka={cka!r}` must be 'exact', 'minibatch' or 'none'.")
        self.measures = _checked_measures(measures)
        check_options(svcca_variance, shape_alpha, rank_spectrum)
        self._family = tuple(name for name in self.measures if name in MEASURES)
        self._neighbours = tuple(name for name in self.measures if name in NEIGHBOUR_MEASURES)
        least = 2 if "cknna" in self._neighbours else 1
        for option, value, low in (("knn_k", knn_k, least), ("knn_sample_size", knn_sample_size, 1)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"`{option}={value!r}` must be an int >= {low}.")
        if not isinstance(knn_seed, int) or isinstance(knn_seed, bool):
            raise ValueError(f"`knn_seed={knn_seed!r}` must be an int.")
        self.knn_k, self.knn_sample_size, self.knn_seed = knn_k, knn_sample_size, knn_seed
        if self._family and cka != "exact":
            raise ValueError(f"`measures` read the exact CKA's sums: set `cka='exact'` (got {cka!r}) or no measures.")
        self.pairs = check_pairs(pairs)
        self.svcca_variance, self.shape_alpha, self.rank_spectrum = (
            float(svcca_variance),
            float(shape_alpha),
            rank_spectrum,
        )
        if not isinstance(cos_bins, int) or isinstance(cos_bins, bool) or cos_bins < 0:
            raise ValueError(f"`cos_bins={cos_bins!r}` must be a non-negative int (0: no COS distribution).")
        self.center = center
        self.cka = cka
        self.max_buffered_samples = max_buffered_samples
        self.cos_bins = cos_bins

    def statistics(self, spec: LayerSpec) -> dict[str, Statistic]:
        layers, center, buffered, bins = spec.num_layers, self.center, self.max_buffered_samples, self.cos_bins
        statistics = {
            "cos": Statistic(
                f"cos(center={center}, max_buffered_samples={buffered}, bins={bins})",
                lambda: LayerCosineSimilarity(layers, center, buffered, dim=spec.dim, bins=bins, sync_on_compute=False),
                _feed_sampled,
            )
        }
        if self.cka == "exact":
            # the stacked cross-moments Z^T Z of every layer pair: any second-moment measure of layer pairs reads them
            # (with some `pairs`: only the blocks of those pairs and the diagonal ones, O(L d^2))
            debiased, pairs = "debiased_cka" in self.measures, self.pairs  # two more sums beside the moments
            name = "stacked_moments" if pairs == "all" else f"pair_moments(pairs={pairs})"
            statistics["cka"] = Statistic(
                f"{name}(debiased=True)" if debiased else name,
                lambda: LayerCKA(layers, spec.dim, debiased=debiased, pairs=pairs, sync_on_compute=False),
                _feed_sampled,
            )
        if self._neighbours:
            if spec.token_level:
                raise UsageError(
                    f"LayerSimilarityMonitor(measures={list(self._neighbours)}): the neighbourhood measures need one "
                    "row per sample, and a language model's rows are tokens: drop them from `measures`."
                )
            size, seed = self.knn_sample_size, self.knn_seed
            statistics["rows"] = Statistic(
                f"row_sample(size={size}, seed={seed})",
                lambda: LayerRowSample(layers, size, seed, dim=spec.dim),
                _feed_indexed,
                needs_index=True,
            )
        if self.cka == "minibatch":
            # the minibatch HSIC is an estimator per dataloader batch
            statistics["cka"] = Statistic(
                "minibatch_hsic", lambda: MinibatchCKA(layers, sync_on_compute=False), _feed_sampled, False
            )
        return statistics

    def results(self, metrics: Metrics, earlier: Mapping[str, Any]) -> dict[str, Any]:
        layers = self.spec.num_layers
        cka = shaped(metrics["cka"].compute(), layers, layers) if "cka" in metrics else None
        cos: Any = metrics["cos"]
        if not self.cos_bins:
            return {"cos": shaped(cos.compute(), layers, layers), "cka": cka, **self._measures(metrics)}
        mean, histogram, negative = cos.compute_distribution()
        histogram = histogram.reshape(layers, layers, self.cos_bins)
        return {
            "cos": shaped(mean, layers, layers),
            "cka": cka,
            "cos_quantile_levels": list(COS_QUANTILES),
            "cos_quantiles": histogram_quantiles(histogram, COS_QUANTILES, -1.0, 1.0),
            "cos_negative_fraction": shaped(negative, layers, layers),
            "cos_histogram_to_last": histogram[:, -1].round().long(),
            **self._measures(metrics),
        }

    def _measures(self, metrics: Metrics) -> dict[str, Any]:
        """The ``measures`` from the exact CKA's (already reduced) sums, and their options; nothing when none."""
        if not self.measures:
            return {}
        pairs = computed_pairs(self.pairs, self.spec.num_layers)
        values: dict[str, Any] = {}
        options: dict[str, Any] = {
            "svcca_variance": self.svcca_variance,
            "shape_alpha": self.shape_alpha,
            "rank_spectrum": self.rank_spectrum,
            "pairs": self.pairs,
        }
        if self._family:
            cka = metrics["cka"]
            assert isinstance(cka, LayerCKA)  # the measures need cka="exact", checked in __init__
            family = self._family
            values.update(
                cka.compute_measures(family, self.svcca_variance, self.shape_alpha, self.rank_spectrum, pairs)
            )
        if self._neighbours:
            rows = metrics["rows"].compute()  # a collective: every rank's sampled rows
            values.update(neighbour_measures(rows, self._neighbours, self.knn_k, pairs))
            options.update(knn_k=self.knn_k, knn_sample_size=self.knn_sample_size, knn_seed=self.knn_seed)
            options["knn_rows"] = int(rows.shape[1])
        return {**values, "measure_options": options}

    def layer_scalars(self, results: Mapping[str, Any]) -> dict[str, float]:
        spec = self.spec
        scalars = per_layer(results["cos"][:, -1], spec, "cos_to_last")
        if results["cka"] is not None:
            scalars.update(per_layer(*self._curve("cka", results["cka"])))
        if results.get("cos_negative_fraction") is not None:
            scalars.update(per_layer(results["cos_negative_fraction"][:, -1], spec, "cos_negative_to_last"))
        for name in self.measures:
            if name == "effective_rank":
                scalars.update(per_layer(results[name], spec, name))
            else:
                scalars.update(per_layer(*self._curve(name, results[name])))
        return scalars

    def _to_next(self, key: str) -> bool:
        """Whether ``key``'s curve is to the next layer: ``pairs="adjacent"`` (COS and minibatch CKA: every pair)."""
        every_pair = key in ("cos", "cos_negative") or (key == "cka" and self.cka != "exact")
        return self.pairs == "adjacent" and not every_pair

    def _curve(self, key: str, matrix: Any) -> tuple[Any, LayerSpec, str]:
        """The per-layer curve of an L x L result: to the last layer, or with ``pairs="adjacent"`` to the next."""
        if not self._to_next(key):
            return matrix[:, -1], self.spec, f"{key}_to_last"
        last = matrix.shape[0] - 1
        rows = list(range(last + 1))
        return matrix[rows, [min(layer + 1, last) for layer in rows]], self.spec, f"{key}_to_next"

    def layer_charts(self) -> dict[str, str]:
        quantities = {"COS": "cos", "CKA": "cka", "fraction of negative COS": "cos_negative"}
        quantities.update({SIMILARITY_LABELS[name]: name for name in self.measures if name != "effective_rank"})
        charts = {}
        for title, key in quantities.items():
            towards = "next" if self._to_next(key) else "last"
            charts[f"{title} to {towards} layer"] = rf"{key}_to_{towards}/layer_\d+"
        if "effective_rank" in self.measures:
            charts["effective rank"] = r"effective_rank/layer_\d+"
        return charts


def _checked_measures(measures: Sequence[str]) -> tuple[str, ...]:
    """The measures in the order of the second-moment ones then the neighbourhood ones; one line for an unknown."""
    given, known = tuple(measures), (*MEASURES, *NEIGHBOUR_MEASURES)
    unknown = [name for name in given if name not in known]
    if unknown:
        raise ValueError(f"Unknown `measures` {unknown[0]!r}: choose from {', '.join(known)}.")
    return tuple(name for name in known if name in given)


def _feed_indexed(metric: Any, batch: LayerOutputs) -> None:
    """Every row with its global sample index (None where the evaluation does not know it: refused by the metric)."""
    metric.update(batch.features, batch.index)


def _feed_sampled(metric: Any, batch: LayerOutputs) -> None:
    """The rows the pairwise measures read: every ``token_stride``-th token of a language model."""
    metric.update(batch.sampled_features)
