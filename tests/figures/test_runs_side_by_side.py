"""`layerwise plot RUN...` and `layerwise report RUN...`: runs side by side, seeds as a mean and a 95 % t-interval.

Six tiny real fits (the shipped digits transfer configs, standard and aligned, seeds 0-2) write real summaries; the
figures, the CSV and the Markdown table are checked against a t-interval computed here with numpy and scipy from
those JSON files, read independently of the package.
"""

import csv
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from matplotlib.collections import PolyCollection
from scipy import stats
from test_figures import named_groups

from layerwise.cli import main
from layerwise.figures.overlay import FIGURES as EVERY_FIGURE
from layerwise.figures.overlay import comparison_figures, load_comparison
from layerwise.figures.seeds import differences, group_runs, t_interval

# what these runs hold: neural collapse beyond NC1 is opt-in (NeuralCollapseMonitor(complete=True)), so not drawn
NC_COMPLETE = ("cdnv", "nc2_equinorm", "nc2_equiangular", "nc2_etf", "nc3", "nc4_agreement")
FIGURES = {name: row for name, row in EVERY_FIGURE.items() if name not in NC_COMPLETE}

ROOT = Path(__file__).resolve().parents[2]
MODES = {"standard": "digits_vit_standard.yaml", "aligned": "digits_vit_aligned.yaml"}
SEEDS = (0, 1, 2)
LABELS = {"standard": "standard", "aligned": "aligned"}  # the model classes in words: what differs between the configs
QUANTITY = {"accuracy": "accuracy", "cos": "cos", "cka": "cka", "nc1": "nc1"}
RANGE = {"accuracy": (0.0, 1.0), "cos": (-1.0, 1.0), "cka": (0.0, 1.0), "nc1": (0.0, np.inf)}  # what each can take


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[Path]]:
    """Two training modes x three seeds of a 2-epoch fit of a 3-block ViT on digits 0-4 (the transfer configs)."""
    from layerwise.cli import LayerwiseCLI

    root = tmp_path_factory.mktemp("side_by_side")
    out: dict[str, list[Path]] = {}
    for mode, config in MODES.items():
        for seed in SEEDS:
            LayerwiseCLI(
                args=[
                    "fit",
                    f"--config={ROOT / 'configs' / 'transfer' / config}",
                    f"--seed_everything={seed}",
                    "--model.init_args.backbone.init_args.embed_dim=16",
                    "--model.init_args.backbone.init_args.depth=3",
                    "--model.init_args.backbone.init_args.num_heads=2",
                    "--data.init_args.num_workers=0",
                    "--trainer.max_epochs=2",
                    "--trainer.limit_train_batches=3",
                    "--trainer.limit_val_batches=2",
                    "--trainer.enable_progress_bar=false",
                    "--trainer.enable_model_summary=false",
                    f"--trainer.logger.init_args.save_dir={root}",
                    f"--trainer.logger.init_args.name={mode}_seed{seed}",
                ]
            )
            folder = root / f"{mode}_seed{seed}" / "version_0"
            assert len(list((folder / "layerwise").glob("val_epoch_*.json"))) == 2
            out.setdefault(mode, []).append(folder)
    return out


def every_run(runs) -> list[Path]:
    return [run for mode in MODES for run in runs[mode]]


def read(run: Path, epoch: int) -> dict:
    """The run's val summary at ``epoch``, read here with json (not through the package)."""
    (path,) = (run / "layerwise").glob(f"val_epoch_{epoch:03d}_step_*.json")
    return json.loads(path.read_text())


def reference(runs, quantity: str, epoch: int = 1) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per mode: the seeds' mean and 95 % t-interval half-width of a per-layer quantity (numpy + scipy, float64)."""
    out = {}
    for mode in MODES:
        rows = []
        for run in runs[mode]:
            summary = read(run, epoch)
            value = summary[quantity]
            rows.append([row[-1] for row in value] if quantity in ("cos", "cka") else value)
        values = np.array(rows, dtype=np.float64)
        n = values.shape[0]
        half = stats.t.ppf(0.975, n - 1) * values.std(axis=0, ddof=1) / np.sqrt(n)
        out[mode] = (values.mean(axis=0), half)
    return out


def places(value: float, width: float) -> int:
    """The decimals of a table cell: the half-width's two significant digits; with no spread, none for a whole
    number, else the mean's three significant digits."""
    if width > 0:
        return max(0, 1 - math.floor(math.log10(width)))
    return 0 if float(value).is_integer() else max(0, 2 - math.floor(math.log10(abs(value))))


def band_extent(collection: PolyCollection, xs) -> tuple[np.ndarray, np.ndarray]:
    """The band's lowest and highest y at each x, from the polygon drawn."""
    vertices = np.concatenate([path.vertices for path in collection.get_paths()])
    low = [vertices[np.isclose(vertices[:, 0], x), 1].min() for x in xs]
    high = [vertices[np.isclose(vertices[:, 0], x), 1].max() for x in xs]
    return np.array(low), np.array(high)


def test_two_modes_by_three_seeds_give_one_figure_per_quantity_with_two_bands(runs, tmp_path, capsys):
    out = tmp_path / "comparison"
    main(["plot", *map(str, every_run(runs)), "--out", str(out), "--format", "png"])
    printed = capsys.readouterr().out
    assert "6 runs at epoch 1 (the last)" in printed
    assert {p.name for p in out.iterdir()} == {f"comparison_{name}.png" for name in FIGURES} | {
        "comparison.csv",
        "comparison.md",
    }
    figures = comparison_figures(load_comparison(every_run(runs)))
    assert set(figures) == set(FIGURES)
    for name, figure in figures.items():
        (ax,) = figure.axes
        bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
        if name == "effective_depth" and not any(
            any(read(run, 1)["effective_depth_reached"].values()) for run in every_run(runs)
        ):  # 2-epoch fits reach no 1 - ε: no depth, so no band; an open marker per group and ε instead
            opened = [line for line in ax.get_lines() if line.get_markerfacecolor() in ("white", "w")]
            assert not bands and len(opened) == 2, name
        else:
            assert len(bands) == 2, name
        legend = named_groups(figure)  # the legend's entries, or the groups' direct labels at their lines' ends
        expected = {"standard (n = 3)", "aligned (n = 3)", "mean ± 95 % t-interval, n = 3; dots: each seed"}
        assert expected <= set(legend), (name, legend)
        assert "validation, epoch 1 (the last)" in ax.get_title(), name


@pytest.mark.parametrize("name", ["accuracy", "cos", "cka", "nc1"])
def test_a_band_is_the_seeds_mean_and_t_interval(runs, name):
    figure = comparison_figures(load_comparison(every_run(runs)))[name]
    (ax,) = figure.axes
    expected = reference(runs, QUANTITY[name])
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    for mode, line, band in zip(MODES, ax.get_lines(), bands):
        mean, half = expected[mode]
        np.testing.assert_allclose(line.get_ydata(), mean, rtol=1e-12, atol=1e-12)
        low, high = band_extent(band, line.get_xdata())
        lower, upper = RANGE[QUANTITY[name]]  # the band is the t-interval clipped to what the quantity can take
        np.testing.assert_allclose(low, np.maximum(mean - half, lower), rtol=1e-9, atol=1e-12)
        np.testing.assert_allclose(high, np.minimum(mean + half, upper), rtol=1e-9, atol=1e-12)
        assert (half > 0).any(), "seeds that agree everywhere test nothing"


def test_the_csv_and_markdown_hold_the_figures_numbers(runs, tmp_path):
    out = tmp_path / "table"
    main(["plot", *map(str, every_run(runs)), "--out", str(out), "--format", "png"])
    with (out / "comparison.csv").open(newline="") as file:
        rows = list(csv.DictReader(file))
    markdown = (out / "comparison.md").read_text()
    for quantity in QUANTITY.values():
        expected = reference(runs, quantity)
        for mode in MODES:
            mean, half = expected[mode]
            got = [row for row in rows if row["quantity"] == quantity and row["group"] == LABELS[mode]]
            assert [int(row["x"]) for row in got] == [1, 2, 3]
            assert {row["seeds"] for row in got} == {"3"}
            np.testing.assert_allclose([float(row["mean"]) for row in got], mean, rtol=1e-12)
            np.testing.assert_allclose([float(row["half_width"]) for row in got], half, rtol=1e-9)
            lower, _ = RANGE[quantity]
            low = np.maximum(mean - half, lower)
            np.testing.assert_allclose([float(row["low"]) for row in got], low, rtol=1e-9, atol=1e-12)
            scale = 100.0 if quantity == "accuracy" else 1.0
            for value, width in zip(mean * scale, half * scale):
                assert f"{value:.{places(value, width)}f} ± {width:.{places(value, width)}f}" in markdown
    early = [row for row in rows if row["quantity"] == "early_exit_accuracy" and row["group"] == "aligned"]
    thresholds = [entry["threshold"] for entry in read(runs["aligned"][0], 1)["early_exit"]]
    assert [float(row["x"]) for row in early] == thresholds
    speed = [[entry["speedup"] for entry in read(run, 1)["early_exit"]] for run in runs["aligned"]]
    got = [float(row["mean"]) for row in rows if row["quantity"] == "early_exit_speedup" and row["group"] == "aligned"]
    np.testing.assert_allclose(got, np.mean(speed, axis=0), rtol=1e-12)
    assert "| layer | standard (n=3) | aligned (n=3) |" in markdown
    assert "standard (n = 3): standard_seed0/version_0, standard_seed1/version_0" in markdown
    assert "## accuracy of the shared head (%)" in markdown


def test_labels_from_globs_and_the_report(runs, tmp_path, capsys):
    root = runs["standard"][0].parents[1]
    patterns = [str(root / f"{mode}_seed*") for mode in MODES]
    out = tmp_path / "html" / "report.html"
    main(["report", *patterns, "--label", "standard", "aligned", "--out", str(out)])
    page = out.read_text()
    assert page.count("data:image/png;base64,") == len(FIGURES)
    assert "standard (n = 3)" in page and "aligned (n = 3)" in page
    assert (out.parent / "comparison.csv").exists() and (out.parent / "comparison.md").exists()
    comparison = load_comparison([Path(p) for p in patterns], ["standard", "aligned"])
    assert [(g.label, len(g.members)) for g in comparison.groups] == [("standard", 3), ("aligned", 3)]


def test_the_epoch_is_the_same_for_every_run(runs):
    chosen = load_comparison(every_run(runs), epoch="0")
    assert chosen.epoch == 0 and chosen.how == "as asked"
    accuracy = {e: np.mean([read(run, e)["accuracy"][-1] for run in every_run(runs)]) for e in (0, 1)}
    best = load_comparison(every_run(runs), epoch="best:accuracy")
    assert best.epoch == max(accuracy, key=accuracy.get)
    assert [summary["epoch"] for summary in best.summaries] == [best.epoch] * 6
    assert best.how == "highest mean accuracy"
    loss = {e: np.mean([read(run, e)["loss"][-1] for run in every_run(runs)]) for e in (0, 1)}
    assert load_comparison(every_run(runs), epoch="best:loss").epoch == min(loss, key=loss.get)


def test_one_run_is_drawn_as_before(runs, tmp_path, capsys):
    from layerwise.figures.summary import summary_figures

    run = runs["standard"][0]
    out = tmp_path / "one"
    main(["plot", str(run), "--out", str(out), "--format", "png"])
    latest = {stage: read_latest(run, stage) for stage in ("val", "val_corrupted")}
    expected = {f"{path.stem}_{name}.png" for path, s in latest.values() for name in summary_figures(s)}
    assert {p.name for p in out.iterdir()} == expected
    assert "comparison" not in capsys.readouterr().out
    first = tmp_path / "first"
    main(["plot", str(run), "--epoch", "0", "--out", str(first), "--format", "png"])
    assert {p.name.split("_step_")[0] for p in first.iterdir()} == {"val_epoch_000", "val_corrupted_epoch_000"}


def read_latest(run: Path, stage: str) -> tuple[Path, dict]:
    path = sorted((run / "layerwise").glob(f"{stage}_epoch_*.json"))[-1]
    return path, json.loads(path.read_text())


def error_line(capsys, argv) -> str:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    return lines[0]


def test_errors_are_one_line_naming_the_option(runs, tmp_path, capsys):
    two = [str(runs["standard"][0]), str(runs["aligned"][0])]
    assert "`--epoch=5`" in error_line(capsys, ["plot", *two, "--epoch", "5"])
    assert "`--epoch=best:nothing`" in error_line(capsys, ["plot", *two, "--epoch", "best:nothing"])
    assert "`--label`" in error_line(capsys, ["plot", *two, "--label", "a", "b", "c"])
    empty = tmp_path / "empty"
    empty.mkdir()
    line = error_line(capsys, ["plot", two[0], str(empty)])
    assert line.startswith("layerwise plot: error: path") and "no layerwise/val_epoch_*.json" in line
    shallow = tmp_path / "shallow" / "version_0"
    shutil.copytree(runs["aligned"][1], shallow)
    for path in (shallow / "layerwise").glob("val_epoch_*.json"):
        summary = json.loads(path.read_text())  # a 2-layer run: its per-layer rows cut to 2, the rest left out
        kept = {key: summary[key] for key in ("run_id", "stage", "epoch", "global_step", "num_samples", "layers")}
        kept.update({key: summary[key][:2] for key in ("layers", "accuracy", "loss")})
        kept["cos"] = [row[:2] for row in summary["cos"][:2]]
        path.write_text(json.dumps(kept))
    line = error_line(capsys, ["plot", two[0], str(shallow), "--out", str(tmp_path / "x")])
    assert line.startswith("layerwise plot: error: path: the runs have different numbers of layers")


def test_t_interval_ignores_missing_values_and_gives_no_width_for_one_value():
    mean, half, n = t_interval([0.5, None, 0.7, math.nan, 0.9])
    assert (n, mean) == (3, pytest.approx(0.7))
    assert half == pytest.approx(stats.t.ppf(0.975, 2) * np.std([0.5, 0.7, 0.9], ddof=1) / math.sqrt(3))
    assert math.isnan(t_interval([0.4])[1])


def test_groups_are_what_differs_besides_seeds_and_output_places():
    def config(cls, seed, depth=6, name="a"):
        return {
            "seed_everything": seed,
            "trainer": {"logger": {"init_args": {"name": name}}, "max_epochs": 3},
            "model": {
                "class_path": f"layerwise.lightning_modules.{cls}",
                "init_args": {"backbone": {"init_args": {"depth": depth}}, "sampling_seed": seed}
                | ({"layer_weights": "linear"} if cls == "Aligned" else {}),
            },
            "data": {"init_args": {"seed": seed}},
        }

    configs = [config("Standard", 0, name="x"), config("Aligned", 1), config("Standard", 2, name="y")]
    assert differences(configs) == ["model.class_path"]
    groups = group_runs(configs, ["r0", "r1", "r2"])
    assert [(g.label, g.members) for g in groups] == [("standard", (0, 2)), ("aligned", (1,))]
    deep = group_runs([config("Standard", 0), config("Standard", 1, depth=3)], ["r0", "r1"])
    assert [g.label for g in deep] == ["depth=6", "depth=3"]
    same = group_runs([config("Aligned", 0), config("Aligned", 1), None], ["r0", "r1", "python_fit"])
    assert [(g.label, g.members) for g in same] == [("aligned", (0, 1)), ("python_fit", (2,))]


def test_the_statistics_are_pure_numpy():
    """figures/seeds.py imports numpy, the standard library and scipy's t: no matplotlib, torch or file access."""
    import ast

    import layerwise.figures.seeds as seeds

    tree = ast.parse(Path(seeds.__file__).read_text())
    imported = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    imported |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"math", "re", "collections", "dataclasses", "typing", "numpy", "scipy"}, imported
