"""The figure registry (figures/registry.py): every analysis names its figure function in the summary it writes, and
what draws it is chosen by code: ``layerwise plot`` and ``report`` draw a user's own analysis exactly as the training
run drew it once the user registers it (``--figures module:function``, or the entry-point group
``layerwise.figures``), and a name nobody registered is skipped with one line, nothing imported.

The user's analysis is the docs' ``examples/feature_norm.py``, imported as a module of the user's own (the examples
folder on the path). Training draws its figure in the drawing process into TensorBoard; ``plot`` writes it as a PNG
from the summary file and ``report`` embeds it: the same pixels (the report's in its 256 colours).
"""

import base64
import io
import json
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
    NeuralCollapseMonitor,
    ResidualNormRatioMonitor,
    _drawing,
)
from layerwise.cli import main
from layerwise.errors import LayerwiseWarning
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
    callbacks = [LayerwiseAnalysis(print_table=False, more=[feature_norm.FeatureNorm()])]
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
        "layerwise.figures.summary:neural_collapse_figures": None,  # draws nothing for NC1 alone
        "feature_norm:feature_norm_figures": None,  # a per-layer analysis's figure reads the whole summary
    }
    # what plot and report draw from the file: the registered functions it names (the user's, given by the user)
    drawn = summary_figures(summary, [feature_norm.feature_norm_figures])
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

    main(["plot", str(summary_path), "--out", str(tmp_path / "unregistered"), "--format", "png"])
    assert not (tmp_path / "unregistered" / f"{summary_path.stem}_feature_norm.png").exists()  # named, not registered
    assert "'feature_norm:feature_norm_figures', which is not registered" in capsys.readouterr().err
    typed = ["--figures", "feature_norm:feature_norm_figures"]
    main(["plot", str(summary_path), "--out", str(tmp_path / "plot"), "--format", "png", "--dpi", "150", *typed])
    plotted = tmp_path / "plot" / f"{summary_path.stem}_feature_norm.png"
    assert np.array_equal(rgb(plotted.read_bytes()), rgb(printed.getvalue()))

    main(["report", str(summary_path.parent.parent), "--out", str(tmp_path / "report.html"), *typed])
    page = (tmp_path / "report.html").read_text()
    (embedded,) = re.findall(r'data-figure="feature_norm"><img [^>]*src="data:image/png;base64,([^"]+)"', page)
    quantized = Image.open(printed).convert("RGB").quantize(colors=256, method=Image.Quantize.FASTOCTREE)
    assert np.array_equal(rgb(base64.b64decode(embedded)), np.asarray(quantized.convert("RGB")))


def test_a_summary_naming_a_function_nobody_registered_draws_the_rest_and_imports_nothing(tmp_path):
    summary = {
        "layers": [1, 2, 3],
        "accuracy": [0.2, 0.5, 0.9],
        FIGURE_FUNCTIONS: {
            "layerwise.figures.summary:logit_lens_figures": None,
            "gone_module:its_figures": "gone",
            "os:system": "gone",
        },
        "gone": {"mean": [1.0]},
    }
    with pytest.warns(
        LayerwiseWarning, match=r"'gone_module:its_figures', which is not registered.*layerwise\.figures"
    ):
        with pytest.warns(LayerwiseWarning, match=r"'os:system', which is not registered"):
            figures = summary_figures(summary)
    assert list(figures) == ["similarity_accuracy"]
    assert "gone_module" not in sys.modules


def entry_points_with(*entries: str):
    """``importlib.metadata.entry_points`` as if a package installed ``entries`` in the group layerwise.figures."""
    from importlib.metadata import EntryPoint

    installed = [
        EntryPoint(name=f"plugin{i}", value=value, group=registry.ENTRY_POINT_GROUP) for i, value in enumerate(entries)
    ]
    return lambda group: [entry for entry in installed if entry.group == group]


def test_a_plugin_of_the_entry_point_group_draws_the_summaries_that_name_it(
    tmp_path, feature_norm, monkeypatch, capsys
):
    summary = {
        "layers": [1, 2],
        "feature_norm": [1.0, 2.0],
        FIGURE_FUNCTIONS: {"feature_norm:feature_norm_figures": None},  # a per-layer analysis reads the summary
    }
    (tmp_path / "s.json").write_text(json.dumps(summary))
    monkeypatch.setattr(registry.metadata, "entry_points", entry_points_with("feature_norm:feature_norm_figures"))
    main(["plot", str(tmp_path / "s.json"), "--out", str(tmp_path / "out"), "--format", "png"])
    assert (tmp_path / "out" / "s_feature_norm.png").is_file()
    assert "not registered" not in capsys.readouterr().err
    # a broken plug-in is one line; the others still draw
    monkeypatch.setattr(
        registry.metadata, "entry_points", entry_points_with("no_such_plugin:f", "feature_norm:feature_norm_figures")
    )
    with pytest.warns(LayerwiseWarning, match=r"plug-in plugin0 = no_such_plugin:f could not be loaded"):
        assert list(summary_figures(summary)) == ["feature_norm"]


def test_a_figures_option_that_names_no_function_is_one_line(tmp_path, capsys):
    (tmp_path / "s.json").write_text(json.dumps({"layers": [1], "accuracy": [0.5]}))
    for typed in ("no_module_here:f", "os"):
        with pytest.raises(SystemExit):
            main(["plot", str(tmp_path / "s.json"), "--out", str(tmp_path / "out"), "--figures", typed])
        err = capsys.readouterr().err
        assert f"`--figures={typed}`" in err and "Traceback" not in err


def test_a_summary_written_before_the_registry_is_drawn_with_the_package_figures():
    summary = {"layers": [1, 2], "cos": [[1.0, 0.5], [0.5, 1.0]], "accuracy": [0.5, 0.9]}
    assert list(summary_figures(summary)) == ["cos", "similarity_accuracy"]


def test_a_package_function_reads_its_own_key_whatever_the_file_says():
    summary = {
        "layers": [1, 2],
        "cos": [[1.0, 0.5], [0.5, 1.0]],
        "detection_ap50": [0.1, 0.2],
        FIGURE_FUNCTIONS: {"layerwise.figures.summary:detection_figures": "cos"},
    }
    assert list(summary_figures(summary)) == ["detection_ap50"]


def test_every_package_analysis_names_a_figure_function_of_the_package_table():
    """PACKAGE_FIGURES (what draws a summary without a registry) and the callbacks' own figures are one list."""
    named = {
        (LayerSimilarityMonitor.figures, None),
        (LogitLensMonitor.figures, None),
        (EffectiveDepthMonitor.figures, None),
        (NeuralCollapseMonitor.figures, None),
        (DetectionLayerAP.figures, DetectionLayerAP.key),
        (ResidualNormRatioMonitor.figures, ResidualNormRatioMonitor.key),
        (CrossModelComparison.figures, CrossModelComparison.key),
        (BlockCoupling.figures, BlockCoupling.key),
    }
    assert named == set(PACKAGE_FIGURES)
    package = [function for function, _ in PACKAGE_FIGURES]
    functions, _ = registry.registered(package, (), {})
    for function in package:  # each registered under the name a summary records it by
        assert functions[registry.reference(function)] is function


def test_the_figures_say_which_cka_was_computed():
    """A minibatch-CKA run (the summary's analyses record its estimator) is drawn as minibatch CKA, not linear CKA."""
    summary = {
        "layers": [1, 2],
        "cos": [[1.0, 0.5], [0.5, 1.0]],
        "cka": [[1.0, 0.4], [0.4, 1.0]],
        "accuracy": [0.3, 0.9],
    }
    for estimator, name, colour_bar in (
        ("minibatch", "minibatch CKA", "minibatch CKA"),
        ("exact", "CKA", "linear CKA"),
    ):
        summary["analyses"] = {"similarity": {"class": "x", "options": {"cka": estimator}, "columns": {}}}
        figures = summary_figures(summary)
        assert figures["cka"].axes[0].get_title().startswith(f"{name} between every pair of layers")
        assert figures["cka"].axes[1].get_ylabel() == colour_bar
        profile = [line.get_label() for axes in figures["similarity_accuracy"].axes for line in axes.get_lines()]
        assert f"{name} to the last layer" in profile


def test_nothing_in_the_package_imports_a_name_read_from_a_file():
    """Every import by name in the package, and where its name comes from: never a results file.

    A new one fails here until it is added with its reason (docs/security.md lists what is trusted).
    """
    reasons = {
        "layerwise/cli/app.py": "the static COMMANDS table",
        "layerwise/datamodules/__init__.py": "the static _MODULES table",
        "layerwise/extras.py": "the optional dependency groups",
        "layerwise/engines/checkpoint.py": "a checkpoint's class path, under the trusted prefix only",
        "layerwise/figures/registry.py": "typed_functions: the --figures option the user typed",
    }
    importers = {
        path.relative_to(REPO).as_posix()
        for path in (REPO / "layerwise").rglob("*.py")
        if re.search(r"import_module\(|__import__\(", path.read_text(encoding="utf-8"))
    }
    assert importers == set(reasons)
    source = (REPO / "layerwise/figures/registry.py").read_text(encoding="utf-8")
    assert source.count("import_module(") == 1 and "def typed_functions" in source
