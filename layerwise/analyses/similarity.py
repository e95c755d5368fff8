"""COS and CKA between every pair of layers."""

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from layerwise.analyses.base import Analysis, Metrics, Statistic, refuse_runner_options
from layerwise.analyses.layer_spec import LayerSpec, per_layer, shaped
from layerwise.engines.readout import LayerOutputs
from layerwise.figures.style import SIMILARITY_LABELS
from layerwise.figures.summary import similarity_figures
from layerwise.metrics import LayerCKA, LayerCosineSimilarity, MinibatchCKA
from layerwise.metrics.functional_distribution import histogram_quantiles
from layerwise.metrics.functional_family import check_measures, check_options

CKAEstimator = Literal["exact", "minibatch", "none"]
Measure = Literal["debiased_cka", "cca", "svcca", "pwcca", "procrustes", "shape", "effective_rank"]
RankSpectrum = Literal["singular", "covariance"]
MeasurePairs = Literal["all", "to_last", "adjacent"]


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
    pair measure costs a few (d, d) decompositions per layer pair at the end of the validation; ``measure_pairs``
    limits them to the ``to_last`` (l, L) or ``adjacent`` (l, l+1) pairs, NaN (null) elsewhere: L pairs instead of
    L² (the sums kept are the same).

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
        measure_pairs: MeasurePairs = "all",
        **refused: Any,
    ) -> None:
        refuse_runner_options(type(self).__name__, refused)
        if cka not in ("exact", "minibatch", "none"):
            raise ValueError(f"`cka={cka!r}` must be 'exact', 'minibatch' or 'none'.")
        self.measures = check_measures(measures)
        check_options(svcca_variance, shape_alpha, rank_spectrum)
        if self.measures and cka != "exact":
            raise ValueError(f"`measures` read the exact CKA's sums: set `cka='exact'` (got {cka!r}) or no measures.")
        if measure_pairs not in ("all", "to_last", "adjacent"):
            raise ValueError(f"`measure_pairs={measure_pairs!r}` must be 'all', 'to_last' or 'adjacent'.")
        self.measure_pairs = measure_pairs
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
            debiased = "debiased_cka" in self.measures  # two more sums beside the moments
            statistics["cka"] = Statistic(
                "stacked_moments(debiased=True)" if debiased else "stacked_moments",
                lambda: LayerCKA(layers, spec.dim, debiased=debiased, sync_on_compute=False),
                _feed_sampled,
            )
        elif self.cka == "minibatch":
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
        cka = metrics["cka"]
        assert isinstance(cka, LayerCKA)  # the measures need cka="exact", checked in __init__
        layers = self.spec.num_layers
        pairs = {
            "all": None,
            "to_last": [(layer, layers - 1) for layer in range(layers)],
            "adjacent": [(layer, min(layer + 1, layers - 1)) for layer in range(layers)],
        }[self.measure_pairs]
        values = cka.compute_measures(self.measures, self.svcca_variance, self.shape_alpha, self.rank_spectrum, pairs)
        options = {
            "svcca_variance": self.svcca_variance,
            "shape_alpha": self.shape_alpha,
            "rank_spectrum": self.rank_spectrum,
            "measure_pairs": self.measure_pairs,
        }
        return {**values, "measure_options": options}

    def layer_scalars(self, results: Mapping[str, Any]) -> dict[str, float]:
        spec = self.spec
        scalars = per_layer(results["cos"][:, -1], spec, "cos_to_last")
        if results["cka"] is not None:
            scalars.update(per_layer(results["cka"][:, -1], spec, "cka_to_last"))
        if results.get("cos_negative_fraction") is not None:
            scalars.update(per_layer(results["cos_negative_fraction"][:, -1], spec, "cos_negative_to_last"))
        for name in self.measures:
            if name == "effective_rank":
                scalars.update(per_layer(results[name], spec, name))
            else:
                scalars.update(per_layer(results[name][:, -1], spec, f"{name}_to_last"))
        return scalars

    def layer_charts(self) -> dict[str, str]:
        quantities = {"COS": "cos", "CKA": "cka", "fraction of negative COS": "cos_negative"}
        quantities.update({SIMILARITY_LABELS[name]: name for name in self.measures if name != "effective_rank"})
        charts = {f"{title} to last layer": rf"{key}_to_last/layer_\d+" for title, key in quantities.items()}
        if "effective_rank" in self.measures:
            charts["effective rank"] = r"effective_rank/layer_\d+"
        return charts


def _feed_sampled(metric: Any, batch: LayerOutputs) -> None:
    """The rows the pairwise measures read: every ``token_stride``-th token of a language model."""
    metric.update(batch.sampled_features)
