"""The one lifecycle of the analysis callbacks (callbacks/lifecycle.py), and the docs' example of a per-layer analysis.

docs/callbacks.md's "Add your own analysis" quotes ``examples/feature_norm.py`` verbatim (an ``Analysis`` over the pool
of statistics, run by ``LayerwiseAnalysis``); the example runs on 1 and on 2 gloo processes (``ddp_fork``, 101
samples: one padded) and gives the same JSON, equal to a float64 reference taken from the backbone directly. The
residual norm ratio, ported onto the lifecycle, gets its Custom Scalars charts in the run's one layout (next to
LayerwiseAnalysis's) and draws on the figure schedule of the other callbacks.
"""

import importlib.util
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import (
    assert_json_close,
    digits,
    fitted_backbone,
    fitted_module,
    read_summary,
    train_loader,
    trainer,
    val_loader,
)
from lightning.pytorch import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2

from layerwise.analyses import Analysis
from layerwise.callbacks import AnalysisCallback, BlockCoupling, LayerwiseAnalysis, ResidualNormRatioMonitor

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "feature_norm.py"
N = 101
# The example is run from its file, not imported, so its figure function cannot travel to the drawing process and is
# drawn in a thread, with a warning once per process (test_drawing asserts it); which test meets it depends on order.
pytestmark = pytest.mark.filterwarnings(
    r"ignore:.*feature_norm_example\..* cannot travel to the drawing process:layerwise.errors.LayerwiseWarning"
)


def example_module():
    spec = importlib.util.spec_from_file_location("feature_norm_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def events(log_dir: str) -> EventAccumulator:
    accumulator = EventAccumulator(log_dir, size_guidance={"images": 0, "scalars": 0, "tensors": 0})
    accumulator.Reload()
    return accumulator


def layout(accumulator: EventAccumulator) -> dict[str, str]:
    """The run's Custom Scalars as TensorBoard shows them (the last layout written): title -> tag regex."""
    config = accumulator.Tensors("custom_scalars__config__")[-1]
    written = layout_pb2.Layout.FromString(config.tensor_proto.string_val[0])
    return {chart.title: chart.multiline.tag[0] for category in written.category for chart in category.chart}


def test_the_docs_quote_the_example_verbatim():
    page = (REPO / "docs" / "callbacks.md").read_text()
    section = page.split("## Add your own analysis", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert EXAMPLE.read_text() in blocks, (
        "docs/callbacks.md's 'Add your own analysis' block differs from examples/feature_norm.py"
    )
    assert issubclass(example_module().FeatureNorm, Analysis)
    assert not issubclass(example_module().FeatureNorm, Callback)
    code = [line for line in EXAMPLE.read_text().splitlines() if line.strip()]
    assert len(code) <= 30, f"the user's per-layer analysis takes {len(code)} lines"


def only_feature_norm(**options) -> LayerwiseAnalysis:
    """The example alone in LayerwiseAnalysis: every package analysis off."""
    off = dict(similarity=False, logit_lens=False, neural_collapse=False, depth=False, trajectory=False)
    return LayerwiseAnalysis(**off, more=example_module().FeatureNorm(), **options)


def feature_norms(root: Path, weights: Path, **options) -> dict:
    module = fitted_module()
    module.load_state_dict(torch.load(weights))
    callback = only_feature_norm()
    trainer(root, [callback], **options).validate(module, val_loader(N, batch_size=16), verbose=False)
    summary = read_summary(root)
    return {"layers": summary["layers"], "mean": summary["feature_norm"]}


def test_the_example_on_two_processes_equals_one_and_a_float64_reference(tmp_path, single_thread):
    weights = tmp_path / "weights.pt"
    torch.save(fitted_module().state_dict(), weights)
    one = feature_norms(tmp_path / "one", weights)
    many = feature_norms(tmp_path / "many", weights, devices=2, strategy="ddp_fork")
    assert_json_close(many, one, rtol=1e-12)

    _, _, x, _ = digits()
    with torch.no_grad():
        features = fitted_backbone()(x[:N]).double().numpy()  # (L, N, d): the residual stream after each block
    reference = np.linalg.norm(features, axis=-1).mean(axis=1)
    assert one["layers"] == [1, 2, 3, 4]
    np.testing.assert_allclose(one["mean"], reference, rtol=1e-6)


def test_the_example_logs_its_scalars_chart_and_figure(tmp_path, capsys):
    logger = TensorBoardLogger(str(tmp_path), name="tb")
    callback = only_feature_norm(print_table=False)  # its own line is printed all the same
    trainer(tmp_path, [callback], logger=logger).validate(fitted_module(), val_loader(N), verbose=False)
    summary = read_summary(logger.log_dir)
    accumulator = events(logger.log_dir)
    for layer, mean in zip(summary["layers"], summary["feature_norm"]):
        (event,) = accumulator.Scalars(f"val/feature_norm/layer_{layer:02d}")
        assert event.value == np.float32(mean)
    assert layout(accumulator) == {"val feature norm per layer": r"^val/feature_norm/layers$"}  # the layer runs' tag
    # its figure, and its chart drawn as an image (a colour per layer), as every analysis callback's charts are
    assert sorted(accumulator.Tags()["images"]) == ["layerwise val/feature norm per layer", "val/feature_norm"]
    assert "mean feature norm (layer 1 -> 4)" in capsys.readouterr().out


def test_residual_ratio_charts_share_the_runs_layout_and_its_figure_the_schedule(tmp_path):
    logger = TensorBoardLogger(str(tmp_path), name="tb")
    callbacks = [LayerwiseAnalysis(figures_every_n_epochs=2), ResidualNormRatioMonitor(figures_every_n_epochs=2)]
    fit = trainer(tmp_path, callbacks, logger=logger, max_epochs=3, limit_train_batches=2, limit_val_batches=2)
    fit.fit(fitted_module(), train_loader(), val_loader(N))
    accumulator = events(logger.log_dir)

    charts = layout(accumulator)
    scalars = accumulator.Tags()["scalars"]
    for branch in ("block", "attention", "mlp"):
        assert sorted(tag for tag in scalars if tag.startswith(f"val/residual_ratio/{branch}/")) == [
            f"val/residual_ratio/{branch}/layer_{layer:02d}" for layer in range(1, 5)
        ]
        pattern = charts[f"val residual ratio {branch} per layer"]  # the layer runs' tag: a line per layer
        layer_runs = sorted((Path(logger.log_dir) / "layers").iterdir())
        drawn = [
            run.name
            for run in layer_runs
            if any(re.fullmatch(pattern, tag) for tag in events(str(run)).Tags()["scalars"])
        ]
        assert drawn == [f"layer_{layer:02d}" for layer in range(1, 5)]
    assert "val accuracy per layer" in charts  # the monitor's charts stay in the one layout

    drawn = {tag: [event.step for event in accumulator.Images(tag)] for tag in ("val/cos", "val/residual_norm_ratio")}
    assert drawn["val/residual_norm_ratio"] == drawn["val/cos"] == [4, 6]  # epoch 2 and the last, epoch 3


@pytest.mark.parametrize("command", ["validate", "test"])
def test_every_analysis_reports_on_validate_test_and_every_dataloader(tmp_path, command):
    """Each analysis callback writes its key for every evaluation stage and dataloader, as LayerwiseAnalysis does.

    The second dataloader's results are its own (``<stage>_more``: 101 samples), not mixed into the first's (48).
    """
    callbacks = [
        LayerwiseAnalysis(log_figures=False, more=[example_module().FeatureNorm()]),
        ResidualNormRatioMonitor(log_figures=False),
        BlockCoupling(n_samples=3, ks=[2], log_figures=False),
    ]
    loaders = {"first": val_loader(48), "more": val_loader(N)}
    getattr(trainer(tmp_path, callbacks), command)(fitted_module(), loaders, verbose=False)
    alone = tmp_path / "alone"
    trainer(alone, [only_feature_norm(log_figures=False)]).validate(fitted_module(), val_loader(N), verbose=False)
    stage = "val" if command == "validate" else "test"
    for name, count in ((stage, 48), (f"{stage}_more", N)):
        summary = read_summary(tmp_path, name)
        assert summary["num_samples"] == count, name
        assert summary["residual_norm_ratio"]["num_samples"] == count, name
        assert {"feature_norm", "coupling", "cka", "accuracy", "nc1", "effective_depth"} <= set(summary), name
        assert summary["stage"] == name
    more = read_summary(tmp_path, f"{stage}_more")["feature_norm"]
    assert_json_close(more, read_summary(alone)["feature_norm"], rtol=1e-12)


def test_an_analysis_without_a_json_key_is_refused():
    class Nameless(AnalysisCallback):
        pass

    with pytest.raises(TypeError, match="sets no `key`"):
        Nameless()


EVALUATION_HOOKS = [
    f"on_{stage}_{hook}"
    for stage in ("validation", "test")
    for hook in ("epoch_start", "batch_start", "batch_end", "epoch_end")
]


def test_every_analysis_of_the_package_is_on_the_one_lifecycle():
    """No second lifecycle: every analysis callback is an AnalysisCallback and keeps its evaluation hooks."""
    import layerwise.callbacks as callbacks

    analyses = [
        getattr(callbacks, name)
        for name in callbacks.__all__
        if isinstance(getattr(callbacks, name), type) and issubclass(getattr(callbacks, name), Callback)
    ]
    others = {callbacks.ProgressLines, callbacks.EarlyExitPredictionWriter}  # progress lines, a prediction writer
    assert len(analyses) - len(others) >= 6
    for name in callbacks.__all__:  # the per-layer analyses are plain objects, run by LayerwiseAnalysis
        kind = getattr(callbacks, name)
        assert not issubclass(kind, Analysis) or not issubclass(kind, Callback), name
    for cls in analyses:
        if cls in others:
            continue
        assert issubclass(cls, AnalysisCallback), cls.__name__
        for hook in EVALUATION_HOOKS:
            assert getattr(cls, hook) is getattr(AnalysisCallback, hook), f"{cls.__name__}.{hook} is its own"


def test_the_callbacks_of_one_run_share_one_record_held_on_the_callback(tmp_path):
    """The run's shared state (summary id, paths shown, charts, history) lives on its first analysis callback."""
    callbacks = [LayerwiseAnalysis(log_figures=False), ResidualNormRatioMonitor(log_figures=False)]
    first = trainer(tmp_path / "first", callbacks)
    first.validate(fitted_module(), val_loader(N), verbose=False)
    record = callbacks[0]._record
    assert record is not None and callbacks[1]._record is record and record.trainer() is first
    summary = read_summary(tmp_path / "first")
    assert summary["run_id"] == record.run_id and {"residual_norm_ratio", "cos"} <= set(summary)
    trainer(tmp_path / "second", callbacks).validate(fitted_module(), val_loader(N), verbose=False)
    assert callbacks[1]._record is callbacks[0]._record is not record  # a new run, a new record
    source = "\n".join(path.read_text() for path in (REPO / "layerwise" / "callbacks").glob("*.py"))
    assert "WeakKeyDictionary" not in source, "run state belongs on the callbacks, not in module-level tables"


def test_each_analysis_charts_its_own_quantities(tmp_path):
    """Two per-layer analyses in one run: the chart images of each one's scalars, from the run's history."""
    logger = TensorBoardLogger(str(tmp_path), name="tb")
    callbacks = [LayerwiseAnalysis(neural_collapse=False, depth=False, trajectory=False, print_table=False)]
    fit = trainer(tmp_path, callbacks, logger=logger, max_epochs=2, limit_train_batches=2, limit_val_batches=2)
    fit.fit(fitted_module(), train_loader(), val_loader(N))
    images = events(logger.log_dir).Tags()["images"]
    assert {"layerwise val/COS to last layer", "layerwise val/accuracy per layer"} <= set(images)
