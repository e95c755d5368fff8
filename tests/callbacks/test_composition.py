"""One plug-in layer: a per-layer analysis is a plain object declaring its options once and the statistics it reads
by name; ``LayerwiseAnalysis``, the one callback that runs analyses, composes them (a config's
``logit_lens: {thresholds: ...}``), accumulates every statistic once in one pool, reduces it in one all-reduce, and
runs a user's own analysis (``more``) like a package one: its line, its scalars, its columns, its options recorded.
"""

import inspect

import numpy as np
import pytest
import torch
from helpers import fitted_backbone, fitted_module, read_summary, trainer, val_loader
from lightning.pytorch import LightningModule
from torchmetrics import Metric

from layerwise.analyses import Analysis, Statistic, per_layer
from layerwise.callbacks import (
    EffectiveDepthMonitor,
    LayerSimilarityMonitor,
    LayerwiseAnalysis,
    LogitLensMonitor,
    NeuralCollapseMonitor,
    TrajectoryMonitor,
    _loader,
)
from layerwise.cli import LayerwiseCLI
from layerwise.errors import UsageError
from layerwise.metrics import LayerAccuracy

ANALYSES = (LayerSimilarityMonitor, LogitLensMonitor, NeuralCollapseMonitor, EffectiveDepthMonitor, TrajectoryMonitor)
PACKAGE = {"similarity", "logit_lens", "neural_collapse", "depth", "trajectory", "more"}


def own_options(kind: type) -> set[str]:
    parameters = inspect.signature(kind.__init__).parameters.values()
    return {p.name for p in parameters if p.name != "self" and p.kind is not p.VAR_KEYWORD}


def test_each_option_is_declared_once_in_its_analysis():
    runner = own_options(LayerwiseAnalysis) - PACKAGE
    assert {"layers", "every_n_epochs", "token_stride", "log_figures"} <= runner
    for kind in ANALYSES:  # an analysis's own options: in its class only, not in the callback that runs it
        assert not own_options(kind) & (runner | PACKAGE), kind.__name__
        assert not issubclass(kind, pl_callback()), kind.__name__  # a plain object, never a callback


def pl_callback() -> type:
    from lightning.pytorch import Callback

    return Callback


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
    assert kinds[LayerSimilarityMonitor].cka == "minibatch"
    # the command line reaches the last callback given
    more = ["--trainer.callbacks+=LayerwiseAnalysis", "--trainer.callbacks.depth.epsilons=[0.2]"]
    cli = LayerwiseCLI(args=[*args, *more, f"--trainer.logger.init_args.save_dir={tmp_path}"], run=False)
    last = [c for c in cli.trainer.callbacks if isinstance(c, LayerwiseAnalysis)][-1]
    assert [a.epsilons for a in last.analyses if isinstance(a, EffectiveDepthMonitor)] == [[0.2]]


def test_python_errors_are_one_line_naming_the_class_the_option_and_what_to_do():
    with pytest.raises(
        UsageError, match=r"^LogitLensMonitor\(layers=2\): .* give LayerwiseAnalysis\(layers=2, \.\.\.\)"
    ):
        LayerwiseAnalysis(logit_lens=LogitLensMonitor(layers=2))
    with pytest.raises(
        UsageError, match=r"^LayerwiseAnalysis\(depth=.*\): give True, False or a EffectiveDepthMonitor"
    ):
        LayerwiseAnalysis(depth=LogitLensMonitor())
    with pytest.raises(ValueError, match=r"^LogitLensMonitor\(thresholds=0.9\): give a list .* e.g. \[0.9\]"):
        LogitLensMonitor(thresholds=0.9)
    with pytest.raises(UsageError, match=r"^LayerwiseAnalysis\(thresholds=\[0.9\]\): the option moved to logit_lens"):
        LayerwiseAnalysis(thresholds=[0.9])
    with pytest.raises(UsageError, match=r"^LayerwiseAnalysis\(layers='last'\): give None \(every layer\), an int"):
        LayerwiseAnalysis(layers="last")
    with pytest.raises(UsageError, match=r"^LayerwiseAnalysis\(more=5\): give an analysis or a list of them"):
        LayerwiseAnalysis(more=5)
    with pytest.raises(UsageError, match=r"`more` takes analyses"):
        LayerwiseAnalysis(more=[LayerwiseAnalysis()])
    single = LayerwiseAnalysis(more=MeanSquaredNorm())  # one analysis is a list of one
    assert isinstance(single.analyses[-1], MeanSquaredNorm)
    with pytest.raises(TypeError, match=r"^LogitLensMonitor has no option `threshold`"):
        LogitLensMonitor(threshold=[0.9])
    with pytest.raises(ImportError, match=r"LayerwiseMonitor is gone: .* subclasses layerwise.analyses.Analysis"):
        from layerwise.callbacks import LayerwiseMonitor  # noqa: F401


def test_an_analysis_given_to_the_trainer_as_a_callback_is_refused_in_one_line(tmp_path):
    with pytest.raises(
        UsageError, match=r"^LogitLensMonitor is an analysis, not a callback: run it in LayerwiseAnalysis"
    ):
        trainer(tmp_path, [LogitLensMonitor()]).validate(fitted_module(), val_loader(37), verbose=False)


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


def squared_norms(spec) -> Statistic:
    return Statistic(
        "squared_norm", lambda: PerLayerMean(spec.num_layers), lambda m, b: m.update(b.features.double().pow(2).sum(-1))
    )


class MeanSquaredNorm(Analysis):
    """A user's per-layer analysis: the mean squared feature norm of every layer, in float64."""

    provides = ("mean_squared_norm",)

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale

    def statistics(self, spec):
        return {"norm": squared_norms(spec)}

    def results(self, metrics, earlier):
        return {"mean_squared_norm": self.scale * metrics["norm"].compute()}

    def layer_scalars(self, results):
        return per_layer(results["mean_squared_norm"], self.spec, "mean_squared_norm")

    def layer_charts(self):
        return {"mean squared norm": r"mean_squared_norm/layer_\d+"}

    def line(self, results):
        return f"mean squared norm, last layer: {results['mean_squared_norm'][-1]:.3f}"


class RootMeanSquare(Analysis):
    """Reads another analysis's result by name, and the same statistic: computed after it whatever the order."""

    reads = ("mean_squared_norm",)

    def statistics(self, spec):
        return {"norm": squared_norms(spec)}

    def results(self, metrics, earlier):
        return {"root_mean_square": earlier["mean_squared_norm"].sqrt(), "same_pool": metrics["norm"].compute().sqrt()}


def test_a_users_analysis_reaches_what_a_package_analysis_reaches(tmp_path, capsys):
    module: LightningModule = fitted_module()
    callback = LayerwiseAnalysis(
        similarity=False, more=[RootMeanSquare(), MeanSquaredNorm(scale=2.0)], log_figures=False
    )
    trainer(tmp_path, [callback]).validate(module, val_loader(37), verbose=False)
    summary = read_summary(tmp_path)
    features = fitted_backbone().eval()
    images = torch.cat([batch[0] for batch in val_loader(37)])
    with torch.no_grad():
        layers = features(images).double()  # (L, N, d)
    expected = layers.pow(2).sum(-1).mean(1).numpy()
    np.testing.assert_allclose(summary["mean_squared_norm"], 2.0 * expected, rtol=1e-6)
    np.testing.assert_allclose(summary["root_mean_square"], np.sqrt(2.0 * expected), rtol=1e-6)
    np.testing.assert_allclose(summary["same_pool"], np.sqrt(expected), rtol=1e-6)
    # its options and class in the summary, its per-layer results as the report's columns, its line printed
    record = summary["analyses"]["mean_squared_norm"]
    assert record == {
        "class": f"{__name__}.MeanSquaredNorm",
        "options": {"scale": 2.0},
        "columns": {"mean_squared_norm": "mean squared norm"},
    }
    assert summary["analyses"]["logit_lens"]["options"]["thresholds"] == [0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99]
    assert list(summary["analyses"]) == [
        "logit_lens",
        "neural_collapse",
        "depth",
        "trajectory",
        "root_mean_square",
        "mean_squared_norm",
    ]
    assert "mean squared norm, last layer: " in capsys.readouterr().out
    assert set(callback.scalars({"mean_squared_norm": torch.ones(4), **_package_results(callback)})) >= {
        f"mean_squared_norm/layer_0{n}" for n in range(1, 5)
    }
    assert callback.charts()["mean squared norm"] == r"mean_squared_norm/layer_\d+"


def _package_results(callback: LayerwiseAnalysis) -> dict:
    """The last evaluation's results of the package's analyses (what their scalars read)."""
    return {
        "accuracy": torch.zeros(4),
        "loss": torch.zeros(4),
        "saturation_counts": torch.zeros(4),
        "early_exit": [],
        "nc1": torch.zeros(4),
        "effective_depth": {},
        "effective_depth_relative": {},
    }


def test_a_statistic_two_analyses_read_is_accumulated_once(tmp_path, monkeypatch):
    """The logit lens and the effective depth both read ``accuracy``; two user analyses both read ``squared_norm``."""
    updates = {"accuracy": 0, "squared_norm": 0}
    accuracy_update = LayerAccuracy.update

    def counted_accuracy(self, *args):
        updates["accuracy"] += 1
        return accuracy_update(self, *args)

    monkeypatch.setattr(LayerAccuracy, "update", counted_accuracy)
    norm_update = PerLayerMean.update

    def counted_norm(self, *args):
        updates["squared_norm"] += 1
        return norm_update(self, *args)

    monkeypatch.setattr(PerLayerMean, "update", counted_norm)
    monkeypatch.setattr(_loader, "GROUP_BATCHES", 1)  # a group per batch: 3 batches of 16, 16, 5
    callback = LayerwiseAnalysis(similarity=False, more=[MeanSquaredNorm(), RootMeanSquare()], log_figures=False)
    trainer(tmp_path, [callback]).validate(fitted_module(), val_loader(37), verbose=False)
    # LayerAccuracy also backs the lens's separate-head accuracy, fed only by a multi-exit model's heads
    assert updates == {"accuracy": 3, "squared_norm": 3}
    (state,) = callback._states.values()
    names = list(state.pool.statistics)
    assert names.count("accuracy") == 1 and names.count("squared_norm") == 1
    lens, depth = (
        view for analysis, view in zip(state.analyses, state.views) if analysis.name in ("logit_lens", "depth")
    )
    assert lens["accuracy"] is depth["accuracy"]


def test_one_all_reduce_per_evaluation_dataloader(tmp_path, monkeypatch):
    calls = []
    reduce = _loader.all_reduce_sum_states

    def counted(metrics, *args):
        calls.append(len(metrics))
        return reduce(metrics, *args)

    monkeypatch.setattr(_loader, "all_reduce_sum_states", counted)
    callback = LayerwiseAnalysis(more=[MeanSquaredNorm()], log_figures=False)
    trainer(tmp_path, [callback]).validate(fitted_module(), [val_loader(37), val_loader(21)], verbose=False)
    (first, second) = callback._states.values()
    summed = len(first.pool.summed()) + 2  # the pool's sum-state statistics, the sample count, the non-finite rows
    assert calls == [summed, summed]


def composed_summary(root, weights, **options) -> dict:
    module = fitted_module()
    module.load_state_dict(torch.load(weights))
    callback = LayerwiseAnalysis(similarity=False, more=[MeanSquaredNorm(scale=2.0)], log_figures=False)
    trainer(root, [callback], **options).validate(module, val_loader(37), verbose=False)
    return read_summary(root)


def test_a_users_composed_analysis_on_two_processes_equals_one(tmp_path, single_thread, monkeypatch):
    """Its plain torchmetrics metric syncs itself inside results(), beside the package's one all-reduce.

    Every rank reduces the pool once: one all_reduce_sum_states, in which one torch.distributed.all_reduce carries
    every sum state (the others: the per-rank shift of the class moments, L x d, aligned before it).
    """
    weights = tmp_path / "weights.pt"
    torch.save(fitted_module().state_dict(), weights)
    one = composed_summary(tmp_path / "one", weights)
    reduce, calls = _loader.all_reduce_sum_states, tmp_path / "calls"
    calls.mkdir()

    def counted(metrics, *args):  # in each forked rank: the sizes of the all-reduces of this call, one line
        sizes = []
        original = torch.distributed.all_reduce

        def all_reduce(tensor, *more, **options):
            sizes.append(tensor.numel())
            return original(tensor, *more, **options)

        monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce)
        try:
            reduce(metrics, *args)
        finally:
            monkeypatch.setattr(torch.distributed, "all_reduce", original)
        summed = sum(getattr(metric, name).numel() for metric in metrics for name in metric.sum_state_names)
        with open(calls / f"rank{torch.distributed.get_rank()}", "a") as file:
            file.write(f"{sizes.count(summed)} {len(sizes)}\n")

    monkeypatch.setattr(_loader, "all_reduce_sum_states", counted)
    two = composed_summary(tmp_path / "two", weights, devices=2, strategy="ddp_fork")
    for rank in range(2):  # one reduction of the pool; one all-reduce of all its states, one shift alignment
        assert (calls / f"rank{rank}").read_text() == "1 2\n"
    np.testing.assert_allclose(two["mean_squared_norm"], one["mean_squared_norm"], rtol=1e-12)
    np.testing.assert_allclose(two["accuracy"], one["accuracy"], rtol=1e-12)
    assert two["num_samples"] == one["num_samples"] == 37


def test_the_effective_depth_is_the_same_wherever_the_lens_is_given(tmp_path):
    module = fitted_module()
    lens_after = LayerwiseAnalysis(similarity=False, logit_lens=False, more=[LogitLensMonitor()], log_figures=False)
    trainer(tmp_path / "after", [lens_after]).validate(module, val_loader(37), verbose=False)
    lens_before = LayerwiseAnalysis(similarity=False, log_figures=False)
    trainer(tmp_path / "before", [lens_before]).validate(module, val_loader(37), verbose=False)
    alone = LayerwiseAnalysis(similarity=False, logit_lens=False, log_figures=False)
    trainer(tmp_path / "alone", [alone]).validate(module, val_loader(37), verbose=False)
    after, before = read_summary(tmp_path / "after"), read_summary(tmp_path / "before")
    assert after["effective_depth"] == before["effective_depth"] == read_summary(tmp_path / "alone")["effective_depth"]
    assert after["accuracy"] == before["accuracy"]


def test_an_analysis_reading_a_result_nobody_provides_is_refused_naming_it():
    with pytest.raises(UsageError, match=r"^RootMeanSquare reads `mean_squared_norm`, which no analysis"):
        LayerwiseAnalysis(more=[RootMeanSquare()])
