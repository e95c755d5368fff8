"""Every figure renders from a summary without a warning; legends off the curves, integer layer ticks, titles."""

import json
import tempfile
import warnings
import weakref
from pathlib import Path
from typing import Optional

import matplotlib.pyplot as plt
import numpy as np
import pytest

from layerwise.figures.overlay import comparison_figures, load_comparison
from layerwise.figures.style import drawn_at
from layerwise.figures.summary import summary_figures

SUMMARY = {
    "stage": "val",
    "epoch": 7,
    "global_step": 160,
    "layers": [1, 2, 3, 4, 5],
    "cos": [[1.0 if i == j else 0.5 for j in range(5)] for i in range(5)],
    "cka": [[1.0 if i == j else 0.4 for j in range(5)] for i in range(5)],
    "accuracy": [0.5, 0.7, None, 0.9, 0.95],
    "saturation_counts": [10, 5, 3, 1, 1],
    "saturation_cos": [0.3, None, 0.6, 0.8, 1.0],
    "early_exit": [
        {"threshold": t, "accuracy": 0.9, "exit_counts": [4, 6, 5, 3, 2], "speedup": 1.5} for t in (0.5, 0.9)
    ],
    "effective_depth": {"0.01": 5, "0.05": 4, "0.1": 3},
    "effective_depth_relative": {"0.01": 4, "0.05": 3, "0.1": 2},
    "cos_quantile_levels": [0.0, 0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99, 1.0],
    "cos_quantiles": [
        [[-0.9 + 0.1 * i, -0.5, -0.4, -0.1 + 0.1 * i, 0.2 + 0.1 * i, 0.4, 0.6, 0.8, 0.9] for _ in range(5)]
        for i in range(5)
    ],
    "cos_negative_fraction": [[0.3 - 0.05 * i] * 5 for i in range(5)],
}


def test_every_figure_renders_without_warnings_and_says_which_validation():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        figures = summary_figures(SUMMARY)
        for figure in figures.values():
            figure.canvas.draw()
    assert set(figures) == {
        "cos",
        "cka",
        "similarity_accuracy",
        "saturation",
        "early_exit",
        "effective_depth",
        "cos_distribution",
    }
    for name in ("similarity_accuracy", "effective_depth"):
        assert "epoch 7, step 160" in figures[name].axes[0].get_title()
    depth_ticks = figures["effective_depth"].axes[0].get_yticks()
    assert all(float(tick).is_integer() for tick in depth_ticks), depth_ticks
    layer_ticks = figures["similarity_accuracy"].axes[0].get_xticks()
    assert all(float(tick).is_integer() for tick in layer_ticks), layer_ticks


@pytest.mark.parametrize("name", ["similarity_accuracy", "residual_norm_ratio"])
def test_legends_do_not_cover_the_plotting_area(name):
    figure = summary_figures({**SUMMARY, "residual_norm_ratio": synthetic_summary(5)["residual_norm_ratio"]})[name]
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    legends = figure.legends + [ax.get_legend() for ax in figure.axes if ax.get_legend() is not None]
    assert legends
    area = figure.axes[0].get_window_extent(renderer)
    for legend in legends:
        box = legend.get_window_extent(renderer)
        assert not box.overlaps(area), f"{name}: the legend covers the axes"
    plt.close("all")


def test_cos_box_plots_draw_the_summary_quantiles():
    axes = summary_figures(SUMMARY)["cos_distribution"].axes
    boxes, negative = axes[0], axes[1]
    medians = [line.get_ydata()[0] for line in boxes.lines if line.get_color() == "0.1"]  # bxp's median lines
    boxes_q1_q3 = [[min(line.get_ydata()), max(line.get_ydata())] for line in boxes.lines if len(line.get_ydata()) == 5]
    assert medians == pytest.approx([row[-1][4] for row in SUMMARY["cos_quantiles"]])
    expected = [[row[-1][3], row[-1][5]] for row in SUMMARY["cos_quantiles"]]
    np.testing.assert_allclose(boxes_q1_q3, expected, rtol=0, atol=1e-12)
    assert [bar.get_height() for bar in negative.patches] == pytest.approx(
        [100 * row[-1] for row in SUMMARY["cos_negative_fraction"]]
    )


def test_figure_modules_share_only_the_style_module_and_form_no_cycle():
    """figures/: every module draws through figures/style.py; none reaches into another's private helpers."""
    import ast
    from pathlib import Path

    import layerwise.figures

    folder = Path(layerwise.figures.__file__).parent
    edges = {}
    for path in folder.glob("*.py"):
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("layerwise.figures."):
                target = node.module.rsplit(".", 1)[1]
                private = [alias.name for alias in node.names if alias.name.startswith("_")]
                assert not private, f"figures/{path.name} imports private {private} from figures/{target}.py"
                imported.add(target)
        edges[path.stem] = imported

    def reaches(start, goal, seen=()):
        return any(
            nxt == goal or (nxt not in seen and reaches(nxt, goal, (*seen, nxt))) for nxt in edges.get(start, ())
        )

    cycles = [name for name in edges if reaches(name, name)]
    assert not cycles, f"import cycle among figures/: {cycles}"
    assert "style" in edges and not edges["style"], "style.py is the root: it imports no other figure module"


def test_lens_cells_show_spaces_and_newlines():
    import numpy as np

    from layerwise.figures.lens import lens_figure

    figure = lens_figure(np.array([[0.2, 0.9]]), [[" the", "\n"]], [" the", "\n"], [1], "a prompt")
    cells = [text.get_text() for text in figure.axes[0].texts]
    assert cells == ["␣the", "↵"]


# ------------------------------------------------------------------ every figure, read as a reader would, L = 1, 6, 24
def synthetic_summary(num_layers: int) -> dict:
    """A summary of the shape the callbacks write (a quickstart run's keys), for ``num_layers`` layers."""
    rng = np.random.default_rng(num_layers)
    layers = list(range(1, num_layers + 1))
    depth = np.linspace(0.0, 1.0, num_layers)
    cos = [[1.0 - 0.6 * abs(a - b) for b in depth] for a in depth]
    levels = [0.0, 0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99, 1.0]
    branches = ["block", "attention", "mlp"]
    ratio_levels = [0.05, 0.25, 0.5, 0.75, 0.95]
    return {
        "stage": "val",
        "epoch": 31,
        "global_step": 736,
        "num_samples": 360,
        "depth": num_layers,
        "layers": layers,
        "cos": cos,
        "cka": [[value**2 for value in row] for row in cos],
        "cos_quantile_levels": levels,
        "cos_quantiles": [
            [sorted(rng.uniform(-0.2 + 0.8 * d, 1.0, len(levels)).tolist()) for _ in layers] for d in depth
        ],
        "cos_negative_fraction": [[max(0.0, 0.05 - 0.05 * d)] * num_layers for d in depth],
        "accuracy": (0.5 + 0.45 * depth).tolist(),
        "saturation_counts": rng.integers(0, 300, num_layers).tolist(),
        "saturation_cos": (0.5 + 0.5 * depth).tolist(),
        "early_exit": [
            {
                "threshold": tau,
                "accuracy": 0.9 + 0.01 * i,
                "exit_counts": rng.integers(0, 200, num_layers).tolist(),
                "speedup": 4.0 - 0.5 * i,
            }
            for i, tau in enumerate((0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99))
        ],
        "effective_depth": {"0.01": num_layers, "0.05": max(1, num_layers // 2), "0.1": 1},
        "effective_depth_relative": {"0.01": max(1, num_layers // 2), "0.05": 1, "0.1": 1},
        "detection_ap50": (0.2 + 0.3 * depth).tolist(),
        "residual_norm_ratio": {
            "branches": branches,
            "layers": layers,
            "token": "cls",
            "num_samples": 360,
            "mean": [(0.1 + 10 * depth + b).tolist() for b in range(3)],
            "quantile_levels": ratio_levels,
            "quantiles": [[[(0.1 + 10 * d + b) * (0.6 + 0.2 * q) for q in range(5)] for d in depth] for b in range(3)],
        },
        "compare": {
            "cka": [[1.0 - 0.5 * abs(a - b) for b in depth] for a in depth],
            "layers_a": layers,
            "layers_b": layers,
            "model_a": "runs/quickstart/version_0/checkpoints/last.ckpt",
            "model_b": "runs/aligned/version_3/checkpoints/epoch=39-step=920.ckpt",
            "arccos_distance": 0.412,
        },
        "coupling": synthetic_coupling(num_layers),
        # neural collapse complete (NeuralCollapseMonitor(complete=True, ncc=True)); NC3 null at the first layer
        "nc1": (30.0 * np.exp(-4.0 * depth) + 0.05).tolist(),
        "cdnv": (2.0 * np.exp(-3.0 * depth) + 0.01).tolist(),
        "nc2_equinorm": (0.4 - 0.3 * depth).tolist(),
        "nc2_cos_std": (0.3 - 0.2 * depth).tolist(),
        "nc2_equiangular": (0.35 - 0.25 * depth).tolist(),
        "nc2_etf": (0.9 - 0.6 * depth).tolist(),
        "nc3": [None, *(1.2 - 0.8 * depth[1:]).tolist()],
        "nc3_duality": [None, *(1.0 - 0.7 * depth[1:]).tolist()],
        "nc4_agreement": (0.3 + 0.65 * depth).tolist(),
        "nc4_ncc_accuracy": (0.35 + 0.6 * depth).tolist(),
    }


def synthetic_coupling(num_layers: int) -> dict:
    """A block-coupling record (the ``coupling`` part of a summary) of ``num_layers`` blocks and K = 1, 15."""
    rng = np.random.default_rng(num_layers)
    return {
        "ks": [1, 15],
        "coupling_score": [0.123, 0.456],
        "depth_coupling": rng.uniform(0, 1.5, (2, num_layers, num_layers)).tolist(),
        "num_prompts": 32,
        "token": -1,
        "sigma": np.sort(rng.uniform(0.5, 20.0, (num_layers, 15)), axis=1)[:, ::-1].tolist(),
        "inverse_sigma_1": rng.uniform(0.05, 0.5, num_layers).tolist(),
        "trajectory_step_norm": rng.uniform(1.0, 3.0, num_layers).tolist(),
        "trajectory_lss": 1.57,
        "trajectory_expodistance": 0.354,
        "linearisation_cosine": None,
    }


def every_figure(num_layers: int) -> dict:
    """Every figure of ``layerwise.figures`` drawn from synthetic results of a ``num_layers``-layer model."""
    from types import SimpleNamespace

    from layerwise.figures.clip import clip_figures
    from layerwise.figures.coupling import correlation, token_coupling, trajectory_pca
    from layerwise.figures.curves import chart_figures
    from layerwise.figures.heatmap import heatmap
    from layerwise.figures.lens import check_trajectory, lens_figure, trajectory_figure
    from layerwise.figures.stitch import stitch_figure
    from layerwise.figures.style import run_line, stamp
    from layerwise.figures.summary import ap50_per_layer
    from layerwise.figures.sweep import sweep_figure

    rng = np.random.default_rng(num_layers)
    summary = synthetic_summary(num_layers)
    layers = summary["layers"]
    figures = dict(summary_figures(summary))
    figures["detection_ap50"] = ap50_per_layer(summary["detection_ap50"])
    signed = (np.asarray(summary["cos"]) - 0.7).tolist()  # a negative COS: the diverging map, signed cell values
    figures["cos_signed"] = heatmap(signed, layers, "COS between every pair of layers")
    # as TensorBoard gets them: the callbacks' figures stamped with the run, stage, epoch and step
    line = run_line({"stage": "val", "epoch": 31, "global_step": 736}, "quickstart/version_0")
    figures = {name: stamp(figure, line) for name, figure in figures.items()}
    text_layers = layers[: max(1, num_layers // 2)]
    clip = {
        "num_pairs": 512,
        "vision_layers": layers,
        "text_layers": text_layers,
        "vision_cos": summary["cos"],
        "text_cos": [row[: len(text_layers)] for row in summary["cos"][: len(text_layers)]],
        "cross_cos": [[0.1 + 0.2 * a * b / num_layers**2 for b in text_layers] for a in layers],
    }
    figures.update({f"clip_{name}": figure for name, figure in clip_figures(clip).items()})
    figures["coupling_tokens"] = token_coupling(rng.uniform(0, 1, (12, 12)), [0, num_layers - 1], 15, "fixed_input")
    figures["coupling_pca"] = trajectory_pca(rng.normal(size=(num_layers + 1, 12, 16)).cumsum(axis=0))
    names = [f"model-{i}" for i in range(8)]
    scores = rng.uniform(0.1, 0.6, 8)
    fit = {"slope": 0.5, "intercept": 0.1, "r2": 0.42, "p_value": 0.013}
    figures["coupling_correlation"] = correlation(scores, 0.1 + 0.5 * scores, names, fit, "coupling score", "MMLU")
    tokens = [" the", " cat", "\n", " sat", " on", " a", " mat", "."]
    probs = rng.uniform(0, 1, (num_layers, len(tokens)))
    predicted = [[tokens[(row + col) % len(tokens)] for col in range(len(tokens))] for row in range(num_layers)]
    figures["lens"] = lens_figure(probs, predicted, tokens, layers, "Once upon a time, a cat")
    trajectory = {  # layerwise lens --trajectory: the logit and a tuned lens side by side
        "format": "layerwise.lens_trajectory",
        "prompt": "Once upon a time, a cat",
        "input_tokens": tokens,
        "layers": layers,
        "vocab_size": 50257,
        "statistic": "probability",
        "lenses": [
            {
                "name": name,
                "tokens": predicted,
                "top_ids": [[1] * len(tokens)] * num_layers,
                "probability": rng.uniform(0, 1, (num_layers, len(tokens))).tolist(),
                "entropy": rng.uniform(0, 10, (num_layers, len(tokens))).tolist(),
                "kl_to_final": rng.uniform(0, 5, (num_layers, len(tokens))).tolist(),
            }
            for name in ("logit lens", "tuned lens")
        ],
    }
    figures["lens_trajectory"] = trajectory_figure(check_trajectory(trajectory))
    classifier = {**trajectory, "kind": "classifier", "prompt": "sample 7 of the evaluation set"}
    classifier.update(input_tokens=["label 3"], statistic="kl_to_final")
    classifier["lenses"] = [
        {key: [row[:1] for row in value] if isinstance(value, list) else value for key, value in panel.items()}
        for panel in trajectory["lenses"]
    ]
    figures["lens_trajectory_classifier"] = trajectory_figure(check_trajectory(classifier))
    curves = [
        SimpleNamespace(
            label=run,
            key=key,
            name=f"{run} ({'shared head' if key == 'early_exit' else 'exit heads'})",
            rows=[
                {"threshold": tau, "speedup": 4.0 - 3.0 * tau + 0.2 * i, "accuracy": 0.7 + 0.25 * tau - 0.02 * i}
                for tau in (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)
            ],
        )
        for i, (run, key) in enumerate([("standard", "early_exit"), ("aligned", "early_exit"), ("aligned", "x")])
    ]
    figures["sweep"] = sweep_figure(curves)
    pairs = [(layer, layer) for layer in layers]
    rows = [
        {
            "layer_a": a,
            "layer_b": b,
            "acc_drop_b": 0.01 * a,
            "acc_drop_a": 0.02,
            "hans_acc_drop_b": 0.03,
            "hans_acc_drop_a": 0.01,
        }
        for a, b in pairs
    ]
    figures["stitch"] = stitch_figure(rows, {"glue_task": "mnli", "phi": "linear"})
    figures.update(chart_figures("val", synthetic_charts(num_layers)))
    with tempfile.TemporaryDirectory() as folder:  # several runs side by side (layerwise plot RUN...)
        comparison = load_comparison(synthetic_runs(Path(folder), num_layers))
    figures.update({f"comparison_{name}": f for name, f in comparison_figures(comparison).items()})
    return figures


MODES = {"standard": "Standard", "aligned": "AlternatingAligned"}


def synthetic_runs(folder: Path, num_layers: int, seeds: tuple = (0, 1, 2), data: Optional[dict] = None) -> list[Path]:
    """Two training modes x three seeds as run folders (``config.yaml``, ``layerwise/val_epoch_*.json``): each seed's
    summary :func:`synthetic_summary` shifted by a little, with an NC1 per layer; the folders ``layerwise plot``
    reads. ``data``: mode -> the config's ``data.init_args`` (what else differs between the modes)."""
    import yaml

    from layerwise.results import summary_path

    runs = []
    for offset, (mode, model) in enumerate(MODES.items()):
        for seed in seeds:
            run = folder / f"{mode}_seed{seed}" / "version_0"
            config = {"seed_everything": seed, "model": {"class_path": f"layerwise.lightning_modules.{model}"}}
            if data:
                config["data"] = {"init_args": data[mode]}
            run.mkdir(parents=True)
            (run / "config.yaml").write_text(yaml.safe_dump(config))
            for epoch in (0, 1):
                summary = synthetic_summary(num_layers)
                shift = 0.02 * (seed - 1) + 0.05 * offset + 0.01 * epoch
                summary.update(epoch=epoch, global_step=23 * (epoch + 1))
                summary["accuracy"] = [min(1.0, value + shift) for value in summary["accuracy"]]
                summary["cos"] = [[value - shift for value in row] for row in summary["cos"]]
                summary["nc1"] = [60.0 / layer + shift for layer in summary["layers"]]
                for row in summary["early_exit"]:
                    row["accuracy"] += shift
                    row["speedup"] += 10 * shift
                path = summary_path(str(run), "val", epoch, 23 * (epoch + 1))
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(summary))
            runs.append(run)
    return runs


def synthetic_charts(num_layers: int) -> dict:
    """Per-layer scalars over six validations as the callbacks log them (title -> tag -> [(step, value)]): an
    accuracy, an NC1 that starts near 60 and ends near 1, and the early-exit accuracy per threshold."""
    steps = [23, 46, 69, 92, 115, 138]
    return {
        "accuracy per layer": {
            f"val/acc/layer_{layer:02d}": [(step, 0.1 + 0.8 * layer / num_layers * step / 138) for step in steps]
            for layer in range(1, num_layers + 1)
        },
        "NC1 per layer": {
            f"val/nc1/layer_{layer:02d}": [(step, 1.0 + 60.0 / layer * np.exp(-step / 30)) for step in steps]
            for layer in range(1, num_layers + 1)
        },
        "early-exit accuracy": {
            f"val/early_exit/acc/tau_{tau}": [(step, 0.5 + 0.3 * tau * step / 138) for step in steps]
            for tau in (0.5, 0.9, 0.95, 0.99)
        },
    }


def named_groups(figure) -> set:
    """How a comparison figure names its groups, as the legend would: its legend's entries, and each line's direct
    label (``standard`` at a line's end) as ``standard (n = 3)``, n from the legend's words on the band (a direct label
    without them names no count: the test fails)."""
    import re

    from layerwise.figures.style import DIRECT_LABEL

    legend = {text.get_text() for legend in figure.legends for text in legend.get_texts()}
    direct = [text.get_text() for ax in figure.axes for text in ax.texts if text.get_gid() == DIRECT_LABEL]
    if not direct:
        return legend
    (count,) = re.findall(r"t-interval, n = (\d+);", " ".join(legend))
    return legend | {f"{label} (n = {count})" for label in direct}


def drawn_texts(figure) -> list:
    """The texts Agg actually draws for ``figure`` (titles, labels, tick labels, legends, notes), once each."""
    canvas = figure.canvas
    renderer = canvas.get_renderer()
    drawn = {}
    original = renderer.draw_text

    def record(gc, x, y, s, prop, angle, ismath=False, mtext=None):
        if mtext is not None and s.strip():
            drawn[id(mtext)] = mtext
        return original(gc, x, y, s, prop, angle, ismath=ismath, mtext=mtext)

    renderer.draw_text = record
    try:
        canvas.draw()
    finally:
        del renderer.draw_text
    return list(drawn.values())


def text_problems(figure) -> list:
    """What a reader would stumble on: texts over texts, texts off the canvas, axes without labels."""
    import matplotlib.transforms as mtransforms

    texts = drawn_texts(figure)
    renderer = figure.canvas.get_renderer()
    problems = []
    boxes = [(text, text.get_window_extent(renderer).padded(-0.5)) for text in texts]
    canvas = figure.bbox.padded(1.0)
    for i, (text, box) in enumerate(boxes):
        if not (canvas.contains(box.x0, box.y0) and canvas.contains(box.x1, box.y1)):
            problems.append(f"{text.get_text()!r} leaves the canvas")
        for other, other_box in boxes[i + 1 :]:
            if mtransforms.Bbox.intersection(box, other_box) is not None:
                problems.append(f"{text.get_text()!r} overlaps {other.get_text()!r}")
    for ax in figure.axes:
        if not ax.get_visible() or not ax.axison:
            continue
        colorbar = getattr(ax, "_colorbar", None)
        if colorbar is not None:
            long_axis = ax.yaxis if colorbar.orientation == "vertical" else ax.xaxis
            if not long_axis.get_label_text().strip():
                problems.append("a colorbar without a label")
            continue
        for name in ("x", "y"):
            siblings = getattr(ax, f"get_shared_{name}_axes")().get_siblings(ax)
            if not any(getattr(sibling, f"get_{name}label")().strip() for sibling in siblings):
                problems.append(f"an axes ({ax.get_title()!r}) without a {name} label")
    return problems


@pytest.mark.parametrize("width", ["column", "page"])
@pytest.mark.parametrize("num_layers", [1, 6, 24])
def test_every_figure_reads_cleanly(num_layers, width):
    """No text over another text or off the canvas, and every axis says what it shows, for 1, 6 and 24 layers, at a
    journal's column and page width."""
    with drawn_at(width):
        figures = every_figure(num_layers)
    problems = {name: text_problems(figure) for name, figure in figures.items()}
    problems = {name: found for name, found in problems.items() if found}
    assert not problems, "\n".join(f"{name}: {'; '.join(found[:5])}" for name, found in problems.items())


def callback_figures(num_layers: int) -> dict:
    """The figures the callbacks log (every family's, residual, compare, coupling, detection), by name."""
    from layerwise.figures.summary import ap50_per_layer

    summary = synthetic_summary(num_layers)
    return {**summary_figures(summary), "detection_ap50": ap50_per_layer(summary["detection_ap50"])}


def inches(box, figure) -> tuple:
    """A display box as (x0, y0, x1, y1) in inches of ``figure``."""
    return tuple(value / figure.dpi for value in (box.x0, box.y0, box.x1, box.y1))


@pytest.mark.parametrize("width", ["column", "page"])
@pytest.mark.parametrize("num_layers", [1, 6, 24])
def test_one_size_per_kind_of_text(num_layers, width):
    """Titles, axis labels, tick labels and legend texts each have one size in every figure: the style module's for
    the width it is drawn at."""
    from layerwise.figures import style

    sizes = {"title": set(), "label": set(), "tick": set(), "legend": set()}
    with drawn_at(width):
        figures = every_figure(num_layers)
    for figure in figures.values():
        for ax in figure.axes:
            if ax.get_title():
                sizes["title"].add(ax.title.get_fontsize())
            sizes["label"] |= {label.get_fontsize() for label in (ax.xaxis.label, ax.yaxis.label) if label.get_text()}
            sizes["tick"] |= {tick.get_fontsize() for tick in ax.get_yticklabels()}
        for legend in figure.legends + [ax.get_legend() for ax in figure.axes if ax.get_legend() is not None]:
            sizes["legend"] |= {text.get_fontsize() for text in legend.get_texts()}
        if figure._suptitle is not None:
            sizes["title"].add(figure._suptitle.get_fontsize())
        plt.close(figure)
    assert all(len(found) == 1 for found in sizes.values()), sizes
    assert {kind: found.pop() for kind, found in sizes.items()} == {
        kind: getattr(style.PRINTS[width], kind) for kind in sizes
    }


@pytest.mark.parametrize("width", ["column", "page"])
@pytest.mark.parametrize("num_layers", [1, 6, 24])
def test_no_empty_band_and_no_legend_beside_the_axes(num_layers, width):
    """What is drawn fills the canvas to within 0.3 inch above and below; a legend is inside an axes or under all of
    them, at most 0.3 inch below the lowest axis label (no wide empty band, no blank quarter beside a legend)."""
    with drawn_at(width):
        figures = every_figure(num_layers)
    for name, figure in figures.items():
        figure.canvas.draw()
        renderer = figure.canvas.get_renderer()
        drawn = figure.get_tightbbox(renderer)  # in inches
        y0, y1 = drawn.y0, drawn.y1
        height = figure.get_size_inches()[1]
        assert y0 <= 0.3 and height - y1 <= 0.3, f"{name}: {y0:.2f} in empty below, {height - y1:.2f} in above"
        axes = [ax for ax in figure.axes if getattr(ax, "_colorbar", None) is None]
        for legend in figure.legends + [ax.get_legend() for ax in axes if ax.get_legend() is not None]:
            lx0, ly0, lx1, ly1 = inches(legend.get_window_extent(renderer), figure)
            inside = any(
                ax.get_window_extent(renderer).contains(
                    legend.get_window_extent(renderer).x0 + 1, legend.get_window_extent(renderer).y0 + 1
                )
                for ax in axes
            )
            lowest = min(inches(ax.get_tightbbox(renderer), figure)[1] for ax in axes)
            below = ly1 <= lowest + 0.02
            assert inside or below, f"{name}: a legend beside the axes"
            if below:
                assert lowest - ly1 <= 0.3, f"{name}: {lowest - ly1:.2f} in between the axes and the legend"
        plt.close(figure)


def test_cos_distribution_without_negative_samples_draws_no_negative_markers():
    """All COS >= 0: no twin axis whose zero sits at COS = -1 like data, the title says none is negative, and the COS
    axis starts at 0 (no empty lower half)."""
    summary = synthetic_summary(6)
    summary["cos_negative_fraction"] = [[0.0] * 6 for _ in range(6)]
    summary["cos_quantiles"] = [[[0.1 * (i + 1) + 0.01 * q for q in range(9)] for _ in range(6)] for i in range(6)]
    figure = summary_figures(summary)["cos_distribution"]
    assert len(figure.axes) == 1
    assert "none negative" in figure.axes[0].get_title()
    assert figure.axes[0].get_ylim()[0] >= -0.1
    with_negative = summary_figures(synthetic_summary(6))["cos_distribution"]
    twin = with_negative.axes[1]
    assert "%" in twin.get_ylabel() and twin.get_ylim()[0] == 0.0 and twin.get_ylim()[1] >= 1.0


def test_accuracy_uses_its_axis():
    """The accuracy curve spans most of its axis instead of being squashed against the top of a 0-1 scale."""
    summary = synthetic_summary(6)
    summary["accuracy"] = [0.84, 0.95, 0.967, 0.983, 0.972, 0.969]  # a quickstart run's
    figure = summary_figures(summary)["similarity_accuracy"]
    (axes,) = [ax for ax in figure.axes if ax.get_ylabel() == "accuracy"]
    low, high = axes.get_ylim()
    assert (max(summary["accuracy"]) - min(summary["accuracy"])) / (high - low) >= 0.6


# ------------------------------------------------------------------ figures for print: fonts, colours, the defects
# a reader's complaints (issue part 6): each test below fails on the figures before the fix

# Machado, Oliveira & Fernandes (2009), severity 1.0, applied to linear RGB: how a dichromat sees a colour
CVD = {
    "protanopia": np.array(
        [[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216], [-0.003882, -0.048116, 1.051998]]
    ),
    "deuteranopia": np.array(
        [[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413], [-0.011820, 0.042940, 0.968881]]
    ),
    "tritanopia": np.array(
        [[1.255528, -0.076749, -0.178779], [-0.078411, 0.930809, 0.147602], [0.004733, 0.691367, 0.303900]]
    ),
}


def linear_rgb(colour) -> np.ndarray:
    from matplotlib.colors import to_rgb

    rgb = np.asarray(to_rgb(colour))
    return np.where(rgb <= 0.04045, rgb / 12.92, ((rgb + 0.055) / 1.055) ** 2.4)


def cielab(linear: np.ndarray) -> np.ndarray:
    """CIELAB (D65) of a linear-RGB colour."""
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ np.clip(
        linear, 0, 1
    )
    f = [v ** (1 / 3) if v > 0.008856 else 7.787 * v + 16 / 116 for v in xyz / np.array([0.95047, 1.0, 1.08883])]
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def distance(a, b, vision: str = "normal") -> float:
    """CIELAB ΔE76 between colours ``a`` and ``b`` as seen with normal ``vision`` or one of :data:`CVD`."""
    seen = (lambda x: x) if vision == "normal" else (lambda x: CVD[vision] @ x)
    return float(np.linalg.norm(cielab(seen(linear_rgb(a))) - cielab(seen(linear_rgb(b)))))


def worst_distance(a, b) -> float:
    return min(distance(a, b, vision) for vision in ("normal", *CVD))


def contrast_with_white(colour) -> float:
    """WCAG contrast ratio of ``colour`` on white (a line of contrast under 2 looks faint)."""
    luminance = float(np.array([0.2126, 0.7152, 0.0722]) @ linear_rgb(colour))
    return 1.05 / (luminance + 0.05)


@pytest.mark.parametrize("depth", [2, 4, 6, 8, 12, 24, 48])
def test_layers_are_coloured_in_order_told_apart_by_any_reader_and_none_faint(depth):
    """The layer is ordered, so its colours are (issue 52: a qualitative palette made layers 1 and 3 alike in grey,
    layers 4-6 three reds): lightness grows with the layer, neighbouring layers differ by ΔE >= 4 for normal,
    protanopic, deuteranopic and tritanopic vision up to 12 layers (>= 10 up to 6), the first and last layer by
    >= 50, and no layer is faint on white."""
    from layerwise.figures.style import layer_colour

    colours = [layer_colour(layer, depth) for layer in range(1, depth + 1)]
    lightness = [cielab(linear_rgb(colour))[0] for colour in colours]
    assert all(b > a for a, b in zip(lightness, lightness[1:])), "lightness grows with depth"
    if depth <= 12:
        closest = min(worst_distance(a, b) for a, b in zip(colours, colours[1:]))
        assert closest >= (10 if depth <= 6 else 4), f"neighbouring layers ΔE {closest:.1f}"
    assert worst_distance(colours[0], colours[-1]) >= 50
    faint = {
        layer: round(contrast_with_white(c), 2) for layer, c in enumerate(colours, 1) if contrast_with_white(c) < 2.0
    }
    assert not faint, f"layers faint on white (contrast): {faint}"


def test_the_report_draws_layers_in_the_figures_colours():
    from matplotlib.colors import to_hex

    from layerwise.figures.report import layer_colors
    from layerwise.figures.style import layer_colour

    for depth in (6, 12, 24):
        assert layer_colors(depth) == [to_hex(layer_colour(layer, depth)) for layer in range(1, depth + 1)]


def test_ordered_series_are_told_apart():
    """Seven thresholds (TensorBoard's early-exit chart): neighbouring τ differ by ΔE >= 20 (0.95 and 0.99 were both
    dark purple, ΔE 16) and each has its own marker."""
    from layerwise.figures.style import ordered_style

    styles = [ordered_style(index, 7) for index in range(7)]
    gaps = [distance(a["color"], b["color"]) for a, b in zip(styles, styles[1:])]
    assert min(gaps) >= 20, [round(gap, 1) for gap in gaps]
    assert len({style["marker"] for style in styles}) == 7


def test_accuracy_is_not_on_a_twin_axis_over_the_similarity():
    """Accuracy (0.84-0.98) on a twin axis seemed to cross the CKA line where no value crosses: it has its own axes,
    which overlap no axes of another scale."""
    summary = synthetic_summary(6)
    summary["accuracy"] = [0.84, 0.95, 0.967, 0.983, 0.972, 0.969]
    figure = summary_figures(summary)["similarity_accuracy"]
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    holders = {}
    for ax in figure.axes:
        for line in ax.lines:
            holders[line.get_label()] = ax
    accuracy, cka = holders["accuracy (shared head)"], holders["CKA to the last layer"]
    assert accuracy is not cka
    assert not accuracy.get_window_extent(renderer).overlaps(cka.get_window_extent(renderer))
    assert accuracy.get_ylabel() == "accuracy" and "similarity" in cka.get_ylabel()
    assert accuracy.get_shared_x_axes().joined(accuracy, cka), "one layer axis for both"


@pytest.mark.parametrize(
    ("token", "pooling", "says"),
    [
        ("cls", None, "read at token 0 ([CLS])"),
        ("last", None, "read at each sample's last real token"),
        ("cls", "mean", "the head reads the mean of the tokens"),
    ],
)
def test_the_residual_figure_says_where_the_ratio_is_read_not_how_the_model_pools(token, pooling, says):
    """A mean-pooled ViT's figure said "at the cls token", as if its head read that token."""
    results = dict(synthetic_summary(6)["residual_norm_ratio"], token=token)
    if pooling:
        results["pooling"] = pooling
    figure = summary_figures({"residual_norm_ratio": results})["residual_norm_ratio"]
    title = figure.axes[0].get_title()
    assert says in title
    assert "the cls token" not in title
    assert not text_problems(figure)


def test_every_figure_has_a_caption_in_words():
    """The report captioned its figures with their keys (``cos_distribution``)."""
    from layerwise.figures.summary import caption

    summary = synthetic_summary(6)
    names = set(summary_figures(summary)) | {"detection_ap50"}
    for name in names:
        words = caption(name)
        assert "_" not in words and words != name and len(words.split()) >= 4, (name, words)
    plt.close("all")


def saved_pdfs(folder) -> list:
    """Every PDF the package writes, written into ``folder``: ``layerwise plot`` (every summary figure, the
    residual, comparison and coupling figures included), the sweep command's figure, and every other figure of
    ``layerwise.figures`` saved as PDF the way the commands save figures."""
    import json
    from types import SimpleNamespace

    from layerwise.commands.sweep import write_sweep
    from layerwise.figures.plot import plot_summary
    from layerwise.results import save_figure_atomic, summary_path

    summary = synthetic_summary(6)
    path = summary_path(str(folder / "run"), "val", 31, 736)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(summary))
    written = plot_summary(path, folder / "plot", formats=("pdf",))
    rows = [{"threshold": tau, "speedup": 4.0 - 3.0 * tau, "accuracy": 0.7 + 0.25 * tau} for tau in (0.5, 0.9, 0.99)]
    curves = [SimpleNamespace(label="standard", key="early_exit", name="standard (shared head)", rows=rows)]
    written += [p for p in write_sweep(curves, folder / "sweep", formats=("pdf",)) if p.suffix == ".pdf"]
    for name, figure in every_figure(6).items():
        written.append(save_figure_atomic(folder / "every" / f"{name}.pdf", figure))
        plt.close(figure)
    return written


def test_every_pdf_the_package_writes_embeds_truetype_fonts_not_type3(tmp_path):
    """Publishers refuse Type 3 fonts (matplotlib's default in PDF): every PDF embeds its fonts as TrueType."""
    import re

    pdfs = saved_pdfs(tmp_path)
    assert len(pdfs) >= 20
    type3 = [path.name for path in pdfs if re.search(rb"/Subtype\s*/Type3", path.read_bytes())]
    assert not type3, f"Type 3 fonts in {type3}"
    no_truetype = [path.name for path in pdfs if b"/FontFile2" not in path.read_bytes()]
    assert not no_truetype, f"no embedded TrueType font in {no_truetype}"


# ------------------------------------------------------------------ TensorBoard: the per-layer charts as images
def test_the_tensorboard_chart_images_give_every_layer_its_colour_and_a_legend():
    """TensorBoard's Custom Scalars draw every layer in one colour, told apart by a marker, the legend folded away:
    the chart images draw each layer in its colour (the figures' colours) and name every layer in a legend."""
    from matplotlib.colors import to_hex

    from layerwise.figures.curves import chart_figures
    from layerwise.figures.style import layer_colour

    figures = chart_figures("val", synthetic_charts(12))
    assert set(figures) == {
        "layerwise val/accuracy per layer",
        "layerwise val/NC1 per layer",
        "layerwise val/early-exit accuracy",
    }
    accuracy = figures["layerwise val/accuracy per layer"]
    lines = accuracy.axes[0].lines
    assert [to_hex(line.get_color()) for line in lines] == [to_hex(layer_colour(k, 12)) for k in range(1, 13)]
    (legend,) = accuracy.legends
    assert sorted(text.get_text() for text in legend.get_texts()) == sorted(f"layer {k}" for k in range(1, 13))
    nc1 = figures["layerwise val/NC1 per layer"].axes[0]
    assert nc1.get_yscale() == "log" and "log scale" in nc1.get_title()
    exits = figures["layerwise val/early-exit accuracy"]
    assert sorted(text.get_text() for text in exits.legends[0].get_texts()) == ["τ 0.5", "τ 0.9", "τ 0.95", "τ 0.99"]
    assert len({to_hex(line.get_color()) for line in exits.axes[0].lines}) == 4
    plt.close("all")


def test_log_tensorboard_charts_logs_an_image_per_chart():
    """What the callbacks hand over at a figure epoch (the analysed epochs' scalars, the charts' regexes) becomes
    one image per chart in the run's TensorBoard, under the Custom Scalars' section and chart names."""
    from layerwise.callbacks import _drawing, _loggers
    from layerwise.callbacks.lifecycle import RunRecord

    images = {}

    class Writer:
        log_dir = "runs/quickstart/version_0"

        def add_custom_scalars(self, layout):
            pass

        def add_image(self, tag, image, global_step, dataformats):
            images[tag] = (global_step, image.shape, dataformats)

    class Trainer:  # a weak-referenceable stand-in: the run's record refers to its trainer
        loggers = [type("Logger", (), {"experiment": Writer()})()]

    trainer = Trainer()
    record = RunRecord(weakref.ref(trainer))
    for step in (23, 46, 69):
        scalars = {f"val/acc/layer_{k:02d}": 0.1 * k + step / 1000 for k in range(1, 7)}
        scalars.update({f"val/nc1/layer_{k:02d}": 60.0 / step / k for k in range(1, 7)})
        history = record.add_history("val", step, scalars)
    charts = {"accuracy per layer": r"val/acc/layer_\d+", "NC1 per layer": r"val/nc1/layer_\d+", "loss": r"val/loss"}
    assert _loggers.chart_loggers(trainer) == [trainer.loggers[0].experiment]
    _loggers.log_tensorboard_charts(trainer, "val", charts, history)
    _drawing.wait_for_figures()
    assert set(images) == {"layerwise val/accuracy per layer", "layerwise val/NC1 per layer"}
    for step, shape, dataformats in images.values():
        assert step == 69 and dataformats == "HWC" and shape[2] == 3 and shape[0] > 200


def test_saturation_cos_is_not_on_a_twin_axis_over_the_bars():
    """The mean COS of the saturating samples ran across the bars on a twin axis: it has its own axes below."""
    figure = summary_figures(synthetic_summary(12))["saturation"]
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    (bars,) = [ax for ax in figure.axes if ax.patches]
    (cos,) = [ax for ax in figure.axes if ax.lines]
    assert bars is not cos and not bars.get_window_extent(renderer).overlaps(cos.get_window_extent(renderer))
    assert "COS" in cos.get_ylabel() and bars.get_ylabel() == "samples"
    plt.close(figure)


@pytest.mark.parametrize("names", [("cos", "cka", "accuracy"), ("block", "attention", "mlp"), ("model a", "model b")])
def test_named_series_drawn_together_are_told_apart_with_any_colour_vision(names):
    """The residual figure's attention (orange) and mlp (green) branches were ΔE 5 apart for a deuteranope."""
    from itertools import combinations

    from layerwise.figures.style import series_colour

    colours = [series_colour(name) for name in names]
    worst = min(worst_distance(a, b) for a, b in combinations(colours, 2))
    assert worst >= 20, f"{names}: ΔE {worst:.1f}"
