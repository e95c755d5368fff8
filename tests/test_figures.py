"""Every figure renders from a summary without a warning; legends off the curves, integer layer ticks, titles."""

import warnings

import matplotlib.pyplot as plt
import numpy as np
import pytest

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


@pytest.mark.parametrize("name", ["similarity_accuracy", "early_exit"])
def test_legends_do_not_cover_the_plotting_area(name):
    figure = summary_figures(SUMMARY)[name]
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
    medians = [line.get_ydata()[0] for line in boxes.lines if line.get_color() == "C1"]  # bxp's median lines
    boxes_q1_q3 = [[min(line.get_ydata()), max(line.get_ydata())] for line in boxes.lines if len(line.get_ydata()) == 5]
    assert medians == pytest.approx([row[-1][4] for row in SUMMARY["cos_quantiles"]])
    expected = [[row[-1][3], row[-1][5]] for row in SUMMARY["cos_quantiles"]]
    np.testing.assert_allclose(boxes_q1_q3, expected, rtol=0, atol=1e-12)
    assert list(negative.lines[0].get_ydata()) == pytest.approx(
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
