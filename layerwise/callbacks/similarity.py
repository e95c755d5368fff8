"""COS and CKA between every pair of layers."""

from typing import Any, Literal

from torchmetrics import Metric

from layerwise.callbacks.base import Family, LayerBatch, LayerSpec, LayerwiseMonitor
from layerwise.callbacks.family import per_layer, shaped
from layerwise.figures.summary import heatmap
from layerwise.metrics import LayerCKA, LayerCosineSimilarity, MinibatchCKA

CKAEstimator = Literal["exact", "minibatch", "none"]


class SimilarityFamily(Family):
    """COS matrix (centred by the evaluated set's mean, or not) and linear CKA matrix."""

    def __init__(self, center: bool = True, cka: CKAEstimator = "exact", max_buffered_samples: int = 65536) -> None:
        if cka not in ("exact", "minibatch", "none"):
            raise ValueError(f"`cka={cka!r}` must be 'exact', 'minibatch' or 'none'.")
        self.center = center
        self.cka_estimator = cka
        self.max_buffered_samples = max_buffered_samples

    def build(self, spec: LayerSpec) -> list[Metric]:
        self.cos = LayerCosineSimilarity(
            spec.num_layers, self.center, self.max_buffered_samples, dim=spec.dim, sync_on_compute=False
        )
        metrics: list[Metric] = [self.cos]
        self.cka = None
        if self.cka_estimator == "exact":
            self.cka = LayerCKA(spec.num_layers, spec.dim, sync_on_compute=False)
        elif self.cka_estimator == "minibatch":
            self.cka = MinibatchCKA(spec.num_layers, sync_on_compute=False)
        return metrics + ([self.cka] if self.cka is not None else [])

    def update(self, batch: LayerBatch) -> None:
        self.cos.update(batch.sampled_features)
        if self.cka is not None:
            self.cka.update(batch.sampled_features)

    def compute(self, spec: LayerSpec) -> dict[str, Any]:
        layers = spec.num_layers
        cka = None if self.cka is None else shaped(self.cka.compute(), layers, layers)
        return {"cos": shaped(self.cos.compute(), layers, layers), "cka": cka}

    def scalars(self, results: dict[str, Any], spec: LayerSpec) -> dict[str, float]:
        scalars = per_layer(results["cos"][:, -1], spec, "cos_to_last")
        if results["cka"] is not None:
            scalars.update(per_layer(results["cka"][:, -1], spec, "cka_to_last"))
        return scalars

    def figures(self, results: dict[str, Any], spec: LayerSpec) -> dict[str, Any]:
        figures = {"cos": heatmap(results["cos"].cpu(), spec.layer_numbers, "COS")}
        if results["cka"] is not None:
            figures["cka"] = heatmap(results["cka"].cpu(), spec.layer_numbers, f"CKA ({self.cka_estimator})")
        return figures

    def charts(self) -> dict[str, str]:
        return {"COS to last layer": r"cos_to_last/layer_\d+", "CKA to last layer": r"cka_to_last/layer_\d+"}


class LayerSimilarityMonitor(LayerwiseMonitor):
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

    Logged: ``val/cos_to_last/layer_XX``, ``val/cka_to_last/layer_XX``; images ``val/cos``, ``val/cka``.
    JSON keys: ``cos``, ``cka`` (L x L). Other args: see :class:`LayerwiseMonitor`.
    """

    def __init__(
        self,
        center: bool = True,
        cka: CKAEstimator = "exact",
        max_buffered_samples: int = 65536,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.families = [SimilarityFamily(center, cka, max_buffered_samples)]
