"""One plug-in layer: a per-layer analysis is one class declaring its options once; ``LayerwiseAnalysis`` composes
the analyses themselves (a config's ``logit_lens: {thresholds: ...}``), refuses monitor options given to a composed
one, and runs a user's own ``LayerwiseMonitor`` subclass (``more``) on the same features and all-reduce.
"""

import inspect

import numpy as np
import pytest
import torch
from helpers import fitted_backbone, fitted_module, read_summary, trainer, val_loader
from lightning.pytorch import LightningModule
from torchmetrics import Metric

from layerwise.callbacks import (
    EffectiveDepthMonitor,
    LayerSimilarityMonitor,
    LayerwiseAnalysis,
    LayerwiseMonitor,
    LogitLensMonitor,
    NeuralCollapseMonitor,
    TrajectoryMonitor,
)
from layerwise.analyses.layer_spec import per_layer
from layerwise.cli import LayerwiseCLI
from layerwise.errors import UsageError

ANALYSES = (LayerSimilarityMonitor, LogitLensMonitor, NeuralCollapseMonitor, EffectiveDepthMonitor, TrajectoryMonitor)


def own_options(kind: type) -> set[str]:
    if "__init__" not in vars(kind):  # no options of its own (TrajectoryMonitor)
        return set()
    parameters = inspect.signature(kind.__init__).parameters.values()
    return {p.name for p in parameters if p.name != "self" and p.kind is not p.VAR_KEYWORD}


def test_each_option_is_declared_once_in_its_analysis():
    monitor = own_options(LayerwiseMonitor)
    composer = own_options(LayerwiseAnalysis)
    assert composer == {"similarity", "logit_lens", "neural_collapse", "depth", "trajectory", "more"}
    for kind in ANALYSES:  # an analysis's own options: in its class only, not in the composer or the monitor
        assert not own_options(kind) & (composer | monitor), kind.__name__


def test_a_config_composes_the_analyses_with_their_own_options(tmp_path):
    config = tmp_path / "analysis.yaml"
    config.write_text(
        "trainer:\n"
        "  callbacks:\n"
        "    - class_path: layerwise.callbacks.LayerwiseAnalysis\n"
        "      init_args:\n"
        "        layers: 2\n"
        "        logit_lens: {thresholds: [0.5, 0.9]}\n"
        "        similarity: {cka: minibatch}\n"
        "        neural_collapse: false\n"
    )
    args = ["--config", "configs/quickstart.yaml", "--config", str(config)]
    cli = LayerwiseCLI(args=[*args, f"--trainer.logger.init_args.save_dir={tmp_path}"], run=False)
    (analysis,) = [c for c in cli.trainer.callbacks if isinstance(c, LayerwiseAnalysis)]
    kinds = {type(a): a for a in analysis.analyses}
    assert set(kinds) == {LayerSimilarityMonitor, LogitLensMonitor, EffectiveDepthMonitor, TrajectoryMonitor}
    assert kinds[LogitLensMonitor].thresholds == [0.5, 0.9] and analysis.layers == 2
    assert kinds[LayerSimilarityMonitor].cka_estimator == "minibatch"
    # the command line reaches the last callback given
    more = ["--trainer.callbacks+=LayerwiseAnalysis", "--trainer.callbacks.depth.epsilons=[0.2]"]
    cli = LayerwiseCLI(args=[*args, *more, f"--trainer.logger.init_args.save_dir={tmp_path}"], run=False)
    last = [c for c in cli.trainer.callbacks if isinstance(c, LayerwiseAnalysis)][-1]
    assert [a.epsilons for a in last.analyses if isinstance(a, EffectiveDepthMonitor)] == [[0.2]]


def test_a_composed_analysis_given_a_monitor_option_is_refused_naming_it():
    with pytest.raises(UsageError, match=r"LogitLensMonitor .* give layers=2 to LayerwiseAnalysis, not to"):
        LayerwiseAnalysis(logit_lens=LogitLensMonitor(layers=2))
    with pytest.raises(ValueError, match=r"`depth=.*` must be True, False or a EffectiveDepthMonitor"):
        LayerwiseAnalysis(depth=LogitLensMonitor())


class PerLayerMean(Metric):
    """A user's plain torchmetrics metric (it syncs itself): the mean of (L, N) values over N, float64 sums."""

    def __init__(self, num_layers: int) -> None:
        super().__init__()
        self.add_state("total", torch.zeros(num_layers, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, values: torch.Tensor) -> None:
        self.total += values.double().sum(1)
        self.count += values.shape[1]

    def compute(self) -> torch.Tensor:
        return self.total / self.count


class MeanSquaredNorm(LayerwiseMonitor):
    """A user's per-layer analysis: the mean squared feature norm of every layer, in float64."""

    def __init__(self, scale: float = 1.0, **kwargs) -> None:
        super().__init__(**kwargs)
        self.scale = scale

    def build(self, spec):
        return {"norm": PerLayerMean(spec.num_layers)}

    def update(self, metrics, batch):
        metrics["norm"].update(batch.features.double().pow(2).sum(-1))  # (L, N)

    def results(self, metrics, earlier):
        return {"mean_squared_norm": self.scale * metrics["norm"].compute()}

    def layer_scalars(self, results):
        return per_layer(results["mean_squared_norm"], self.spec, "mean_squared_norm")


def test_a_users_per_layer_analysis_runs_alone_or_composed_with_the_same_numbers(tmp_path):
    module: LightningModule = fitted_module()
    alone, composed = tmp_path / "alone", tmp_path / "composed"
    trainer(alone, [MeanSquaredNorm(scale=2.0, log_figures=False)]).validate(module, val_loader(37), verbose=False)
    callback = LayerwiseAnalysis(similarity=False, more=[MeanSquaredNorm(scale=2.0)], log_figures=False)
    trainer(composed, [callback]).validate(module, val_loader(37), verbose=False)
    one, both = read_summary(alone), read_summary(composed)
    assert "accuracy" in both and "accuracy" not in one
    features = fitted_backbone().eval()
    images = torch.cat([batch[0] for batch in val_loader(37)])
    with torch.no_grad():
        layers = features(images).double()  # (L, N, d)
    expected = 2.0 * layers.pow(2).sum(-1).mean(1).numpy()
    np.testing.assert_allclose(one["mean_squared_norm"], expected, rtol=1e-6)
    assert one["mean_squared_norm"] == both["mean_squared_norm"]


def composed_summary(root, weights, **options) -> dict:
    module = fitted_module()
    module.load_state_dict(torch.load(weights))
    callback = LayerwiseAnalysis(similarity=False, more=[MeanSquaredNorm(scale=2.0)], log_figures=False)
    trainer(root, [callback], **options).validate(module, val_loader(37), verbose=False)
    return read_summary(root)


def test_a_users_composed_analysis_on_two_processes_equals_one(tmp_path, single_thread):
    """Its plain torchmetrics metric syncs itself inside results(), beside the package's one all-reduce."""
    weights = tmp_path / "weights.pt"
    torch.save(fitted_module().state_dict(), weights)
    one = composed_summary(tmp_path / "one", weights)
    two = composed_summary(tmp_path / "two", weights, devices=2, strategy="ddp_fork")
    np.testing.assert_allclose(two["mean_squared_norm"], one["mean_squared_norm"], rtol=1e-12)
    np.testing.assert_allclose(two["accuracy"], one["accuracy"], rtol=1e-12)
    assert two["num_samples"] == one["num_samples"] == 37


def test_the_effective_depth_reads_only_a_logit_lens_run_before_it(tmp_path):
    module = fitted_module()
    lens_after = LayerwiseAnalysis(similarity=False, logit_lens=False, more=[LogitLensMonitor()], log_figures=False)
    trainer(tmp_path / "after", [lens_after]).validate(module, val_loader(37), verbose=False)
    lens_before = LayerwiseAnalysis(similarity=False, log_figures=False)
    trainer(tmp_path / "before", [lens_before]).validate(module, val_loader(37), verbose=False)
    after, before = read_summary(tmp_path / "after"), read_summary(tmp_path / "before")
    assert after["effective_depth"] == before["effective_depth"]
    assert [a.reads_lens for a in lens_after.analyses if isinstance(a, EffectiveDepthMonitor)] == [False]
    assert [a.reads_lens for a in lens_before.analyses if isinstance(a, EffectiveDepthMonitor)] == [True]
