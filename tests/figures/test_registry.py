"""The figure registry (figures/registry.py): every analysis names its figure function in the summary it writes, so
``layerwise plot`` and ``report`` draw a user's own analysis exactly as the training run drew it.

The user's analysis is the docs' ``examples/feature_norm.py``, imported as a module of the user's own (the examples
folder on the path). Training draws its figure in the drawing process into TensorBoard; ``plot`` writes it as a PNG
from the summary file and ``report`` embeds it: the same pixels (the report's in its 256 colours).
"""

import base64
import io
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import fitted_module, train_loader, trainer, val_loader
from lightning.pytorch.loggers import TensorBoardLogger
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from layerwise.callbacks import (
    BlockCoupling,
    CrossModelComparison,
    DetectionLayerAP,
    EffectiveDepthMonitor,
    LayerSimilarityMonitor,
    LayerwiseAnalysis,
    LogitLensMonitor,
    ResidualNormRatioMonitor,
    _drawing,
)
from layerwise.cli import main
from layerwise.figures import registry, worker
from layerwise.figures.summary import PACKAGE_FIGURES, summary_figures
from layerwise.results import FIGURE_FUNCTIONS, find_summaries, load_summary

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def feature_norm(monkeypatch):
    """examples/feature_norm.py as a user's module: importable by its name, also by the drawing process.

    A user's path is set when the run starts; here the drawing process of an earlier test knows the path of its
    start, so a fresh one is started with this one's.
    """
    monkeypatch.syspath_prepend(str(REPO / "examples"))
    if _drawing._process is not None:
        _drawing._process.close()
    monkeypatch.setattr(_drawing, "_process", None)
    sys.modules.pop("feature_norm", None)
    import feature_norm

    yield feature_norm
    sys.modules.pop("feature_norm", None)


def rgb(png: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))


def test_a_users_analysis_is_drawn_by_training_plot_and_report_alike(tmp_path, feature_norm, capsys):
    logger = TensorBoardLogger(str(tmp_path), name="tb")
    callbacks = [LayerwiseAnalysis(print_table=False), feature_norm.FeatureNormMonitor()]
    in_thread = _drawing.drawn["thread"]
    trainer(tmp_path, callbacks, logger=logger, max_epochs=1, limit_train_batches=1).fit(
        fitted_module(), train_loader(), val_loader(40)
    )
    assert _drawing.drawn["thread"] == in_thread  # every figure drawn in the drawing process, the user's too
    summary_path = find_summaries(Path(logger.log_dir), stage="val")[-1]
    summary = load_summary(summary_path)
    # the registry the analyses filled: the package's per-layer figures and the user's, with the key each reads
    assert summary[FIGURE_FUNCTIONS] == {
        "layerwise.figures.summary:similarity_figures": None,
        "layerwise.figures.summary:logit_lens_figures": None,
        "layerwise.figures.summary:effective_depth_figures": None,
        "feature_norm:feature_norm_figures": "feature_norm",
    }
    # what plot and report draw from the file: the functions it names, imported by name
    drawn = summary_figures(summary)
    assert set(drawn) == {
        *("cos", "cka", "cos_distribution", "similarity_accuracy", "saturation", "early_exit", "effective_depth"),
        "feature_norm",
    }
    events = EventAccumulator(logger.log_dir, size_guidance={"images": 0})
    events.Reload()
    logged = sorted(tag for tag in events.Tags()["images"] if tag.startswith("val/"))
    assert logged == sorted(f"val/{name}" for name in drawn)
    for tag in logged:  # training's images (the figure's own dpi) are the figures drawn from the file
        (event,) = events.Images(tag)
        assert np.array_equal(rgb(event.encoded_image_string), worker.rendered(drawn[tag[4:]])), tag
    printed = io.BytesIO()
    drawn["feature_norm"].savefig(printed, format="png", dpi=150)  # the report's resolution, plot's with --dpi 150

    main(["plot", str(summary_path), "--out", str(tmp_path / "plot"), "--format", "png", "--dpi", "150"])
    plotted = tmp_path / "plot" / f"{summary_path.stem}_feature_norm.png"
    assert np.array_equal(rgb(plotted.read_bytes()), rgb(printed.getvalue()))

    main(["report", str(summary_path.parent.parent), "--out", str(tmp_path / "report.html")])
    page = (tmp_path / "report.html").read_text()
    (embedded,) = re.findall(r'data-figure="feature_norm"><img [^>]*src="data:image/png;base64,([^"]+)"', page)
    quantized = Image.open(printed).convert("RGB").quantize(colors=256, method=Image.Quantize.FASTOCTREE)
    assert np.array_equal(rgb(base64.b64decode(embedded)), np.asarray(quantized.convert("RGB")))


def test_a_summary_naming_a_function_it_cannot_import_draws_the_rest_and_says_which(tmp_path):
    summary = {
        "layers": [1, 2, 3],
        "accuracy": [0.2, 0.5, 0.9],
        FIGURE_FUNCTIONS: {
            "layerwise.figures.summary:logit_lens_figures": None,
            "gone_module:its_figures": "gone",
        },
        "gone": {"mean": [1.0]},
    }
    with pytest.warns(UserWarning, match=r"gone_module:its_figures .* cannot be imported .*PYTHONPATH"):
        figures = summary_figures(summary)
    assert list(figures) == ["similarity_accuracy"]


def test_a_summary_written_before_the_registry_is_drawn_with_the_package_figures():
    summary = {"layers": [1, 2], "cos": [[1.0, 0.5], [0.5, 1.0]], "accuracy": [0.5, 0.9]}
    assert list(summary_figures(summary)) == ["cos", "similarity_accuracy"]


def test_every_package_analysis_names_a_figure_function_of_the_package_table():
    """PACKAGE_FIGURES (what draws a summary without a registry) and the callbacks' own figures are one list."""
    named = {
        (LayerSimilarityMonitor.figures, None),
        (LogitLensMonitor.figures, None),
        (EffectiveDepthMonitor.figures, None),
        (DetectionLayerAP.figures, DetectionLayerAP.key),
        (ResidualNormRatioMonitor.figures, ResidualNormRatioMonitor.key),
        (CrossModelComparison.figures, CrossModelComparison.key),
        (BlockCoupling.figures, BlockCoupling.key),
    }
    assert named == set(PACKAGE_FIGURES)
    for function, _ in PACKAGE_FIGURES:  # each importable by its reference, as plot imports it
        assert registry.function_of(registry.reference(function)) is function
