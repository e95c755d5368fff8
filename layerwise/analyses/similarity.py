"""COS and CKA between every pair of layers."""

from collections.abc import Mapping
from typing import Any, Literal

from layerwise.analyses.base import Analysis, Metrics, Statistic, refuse_runner_options
from layerwise.analyses.layer_spec import LayerSpec, per_layer, shaped
from layerwise.engines.readout import LayerOutputs
from layerwise.figures.summary import similarity_figures
from layerwise.metrics import LayerCKA, LayerCosineSimilarity, MinibatchCKA
from layerwise.metrics.functional_distribution import histogram_quantiles

CKAEstimator = Literal["exact", "minibatch", "none"]


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

    Logged: ``val/cos_to_last/layer_XX``, ``val/cka_to_last/layer_XX``, ``val/cos_negative_to_last/layer_XX``; images
    ``val/cos``, ``val/cka``, ``val/cos_distribution`` (box plots of COS(h_l, h_L) per layer).
    JSON keys: ``cos``, ``cka`` (L x L); with the distribution ``cos_quantile_levels`` (Q), ``cos_quantiles``
    (L x L x Q), ``cos_negative_fraction`` (L x L) and ``cos_histogram_to_last`` (L x cos_bins counts of
    COS(h_l, h_L) on [-1, 1]).
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
        **refused: Any,
    ) -> None:
        refuse_runner_options(type(self).__name__, refused)
        if cka not in ("exact", "minibatch", "none"):
            raise ValueError(f"`cka={cka!r}` must be 'exact', 'minibatch' or 'none'.")
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
            statistics["cka"] = Statistic(
                "stacked_moments", lambda: LayerCKA(layers, spec.dim, sync_on_compute=False), _feed_sampled
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
            return {"cos": shaped(cos.compute(), layers, layers), "cka": cka}
        mean, histogram, negative = cos.compute_distribution()
        histogram = histogram.reshape(layers, layers, self.cos_bins)
        return {
            "cos": shaped(mean, layers, layers),
            "cka": cka,
            "cos_quantile_levels": list(COS_QUANTILES),
            "cos_quantiles": histogram_quantiles(histogram, COS_QUANTILES, -1.0, 1.0),
            "cos_negative_fraction": shaped(negative, layers, layers),
            "cos_histogram_to_last": histogram[:, -1].round().long(),
        }

    def layer_scalars(self, results: Mapping[str, Any]) -> dict[str, float]:
        spec = self.spec
        scalars = per_layer(results["cos"][:, -1], spec, "cos_to_last")
        if results["cka"] is not None:
            scalars.update(per_layer(results["cka"][:, -1], spec, "cka_to_last"))
        if results.get("cos_negative_fraction") is not None:
            scalars.update(per_layer(results["cos_negative_fraction"][:, -1], spec, "cos_negative_to_last"))
        return scalars

    def layer_charts(self) -> dict[str, str]:
        quantities = {"COS": "cos", "CKA": "cka", "fraction of negative COS": "cos_negative"}
        return {f"{title} to last layer": rf"{key}_to_last/layer_\d+" for title, key in quantities.items()}


def _feed_sampled(metric: Any, batch: LayerOutputs) -> None:
    """The rows the pairwise measures read: every ``token_stride``-th token of a language model."""
    metric.update(batch.sampled_features)
