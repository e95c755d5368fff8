"""Early exit with the separate heads of ``MultiExit`` (``exit_early_exit``) and ``layerwise sweep``.

The reference is an independent per-sample Python loop over exit logits recomputed in float64 from the saved
features, with every exit head perturbed so that it disagrees with the shared head.
"""

import copy
import csv
import json

import numpy as np
import pytest
import torch
from helpers import DEPTH, fitted_backbone, head64, read_features, read_summary, trainer, val_loader

from layerwise.callbacks import LayerwiseAnalysis, LogitLensMonitor
from layerwise.cli import main as cli_main
from layerwise.commands.sweep import load_curves
from layerwise.figures.sweep import sweep_figure
from layerwise.lightning_modules import MultiExit, Standard
from layerwise.results import latest_summary


def main(argv):
    cli_main(["sweep", *argv])


THRESHOLDS = [0.3, 0.5, 0.7, 0.9]
N = 101  # validation samples: 6 batches of 16 and a ragged one of 5


def multi_exit_module() -> MultiExit:
    """MultiExit on the fitted tiny ViT; exit heads 1..L-1 sharpened/flattened and shifted (no longer the head)."""
    module = MultiExit(fitted_backbone()).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for scale, head in zip((2.0, 0.7, 1.5), module.exit_heads):
            linear = head[-1]  # (norm, fc_norm, head_drop, head)
            linear.weight.mul_(scale)
            linear.bias.mul_(scale).add_(torch.randn(linear.bias.shape, generator=generator))
    return module


def reference_early_exit(probs: np.ndarray, labels: np.ndarray, thresholds: list[float]) -> list[dict]:
    """Per-sample loop: exit at the first layer whose top-1 probability reaches τ (else the last)."""
    layers, samples, _ = probs.shape
    rows = []
    for tau in thresholds:
        correct, counts = 0, [0] * layers
        for i in range(samples):
            for layer in range(layers):
                if probs[layer, i].max() >= tau or layer == layers - 1:
                    counts[layer] += 1
                    correct += int(probs[layer, i].argmax() == labels[i])
                    break
        speedup = layers * samples / sum((layer + 1) * count for layer, count in enumerate(counts))
        rows.append({"threshold": tau, "accuracy": correct / samples, "exit_counts": counts, "speedup": speedup})
    return rows


def assert_rows_equal(actual: list[dict], expected: list[dict]) -> None:
    assert [row["threshold"] for row in actual] == [row["threshold"] for row in expected]
    for got, want in zip(actual, expected):
        assert got["exit_counts"] == want["exit_counts"]
        assert got["accuracy"] == pytest.approx(want["accuracy"], abs=1e-12)
        assert got["speedup"] == pytest.approx(want["speedup"], abs=1e-12)


@pytest.fixture(scope="module")
def multi_exit_run(tmp_path_factory):
    """A validated MultiExit run: (log dir, module, trainer)."""
    root = tmp_path_factory.mktemp("multi_exit")
    module = multi_exit_module()
    callback = LayerwiseAnalysis(
        logit_lens=LogitLensMonitor(thresholds=THRESHOLDS), save_features=True, log_figures=False
    )
    validation = trainer(root, [callback])
    validation.validate(module, val_loader(N))
    return root, module, validation


def softmax64(logits: torch.Tensor) -> np.ndarray:
    return torch.softmax(logits.double(), dim=-1).numpy()


def test_exit_heads_early_exit_equals_a_per_sample_loop(multi_exit_run) -> None:
    root, module, validation = multi_exit_run
    summary, saved = read_summary(root), read_features(root)
    features, labels = saved["features"].double(), saved["labels"].numpy()
    assert features.shape == (DEPTH, N, module.backbone.embed_dim)

    with torch.no_grad():
        heads = [copy.deepcopy(head).double() for head in module.exit_heads] + [head64(module.backbone)]
        exit_probs = np.stack([softmax64(head(features[layer])) for layer, head in enumerate(heads)])
        shared_probs = softmax64(head64(module.backbone)(features))
    # no confidence sits on a threshold (float32 logits in the module versus float64 here cannot flip an exit)
    for probs in (exit_probs, shared_probs):
        assert np.abs(probs.max(-1)[..., None] - np.asarray(THRESHOLDS)).min() > 1e-5

    expected = reference_early_exit(exit_probs, labels, THRESHOLDS)
    assert_rows_equal(summary["exit_early_exit"], expected)
    assert_rows_equal(summary["early_exit"], reference_early_exit(shared_probs, labels, THRESHOLDS))
    # non-degenerate: exits spread over layers, and the separate heads disagree with the shared head
    assert any(sum(count > 0 for count in row["exit_counts"]) >= 3 for row in expected)
    assert [row["exit_counts"] for row in summary["exit_early_exit"]] != [
        row["exit_counts"] for row in summary["early_exit"]
    ]
    metrics = validation.callback_metrics
    for row in summary["exit_early_exit"]:
        name = f"tau_{row['threshold']:g}"
        assert float(metrics[f"val/exit_early_exit/accuracy/{name}"]) == pytest.approx(row["accuracy"], abs=1e-6)
        assert float(metrics[f"val/exit_early_exit/speedup/{name}"]) == pytest.approx(row["speedup"], rel=1e-6)


def test_one_shared_head_writes_no_exit_heads_early_exit(tmp_path) -> None:
    trainer(
        tmp_path, [LayerwiseAnalysis(logit_lens=LogitLensMonitor(thresholds=THRESHOLDS), log_figures=False)]
    ).validate(Standard(fitted_backbone()), val_loader(N))
    summary = read_summary(tmp_path)
    assert "early_exit" in summary and "exit_early_exit" not in summary and "exit_accuracy" not in summary


def aligned_summary(path) -> dict:
    """A hand-written summary of a shared-head run (no separate heads)."""
    rows = [
        {"threshold": tau, "accuracy": 0.9 - 0.1 * i / 3, "exit_counts": [i, 1, 1, 1], "speedup": 1.1 + i / 7}
        for i, tau in enumerate(THRESHOLDS)
    ]
    summary = {"stage": "val", "epoch": 3, "layers": [1, 2, 3, 4], "accuracy": [0.5, 0.7, 0.8, 0.9]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**summary, "early_exit": rows}))
    return {**summary, "early_exit": rows}


def test_sweep_writes_table_and_figure_with_the_json_numbers(multi_exit_run, tmp_path, capsys) -> None:
    root, _, _ = multi_exit_run
    multi = read_summary(root)
    aligned_file = tmp_path / "aligned" / "layerwise" / "val_epoch_003.json"
    aligned = aligned_summary(aligned_file)
    out = tmp_path / "sweep"
    main([str(aligned_file), str(root), "--labels", "aligned", "multi_exit", "--out", str(out)])

    expected = {
        "aligned (shared head)": aligned["early_exit"],
        "multi_exit (shared head)": multi["early_exit"],
        "multi_exit (separate heads)": multi["exit_early_exit"],
    }
    with open(out / "sweep.csv", newline="") as file:
        table = list(csv.DictReader(file))
    assert [row["curve"] for row in table] == [name for name, rows in expected.items() for _ in rows]
    position = 0
    markdown = (out / "sweep.md").read_text()
    for name, rows in expected.items():
        for row in rows:
            written = table[position]
            position += 1
            for key in ("threshold", "accuracy", "speedup"):
                assert float(written[key]) == row[key]  # full precision
            line = f"| {name} | {row['threshold']:g} | {row['accuracy']:.4f} | {row['speedup']:.4f} |"
            assert line in markdown
    assert markdown in capsys.readouterr().out
    for fmt in ("png", "pdf"):
        assert (out / f"sweep.{fmt}").stat().st_size > 1000

    curves = load_curves(aligned_file, "aligned") + load_curves(latest_summary(root), "multi_exit")
    figure = sweep_figure(curves)
    lines = {line.get_label(): line for line in figure.axes[0].get_lines()}
    assert set(lines) == set(expected)
    for name, rows in expected.items():
        assert list(lines[name].get_xdata()) == [row["speedup"] for row in rows]
        assert list(lines[name].get_ydata()) == [row["accuracy"] for row in rows]
    assert lines["multi_exit (separate heads)"].get_linestyle() == "--"
    assert lines["multi_exit (shared head)"].get_color() == lines["multi_exit (separate heads)"].get_color()


def test_latest_summary_picks_the_last_val_epoch(tmp_path) -> None:
    names = ("val_epoch_000_step_0000010.json", "val_epoch_002_step_0000005.json", "val_epoch_002_step_0000030.json")
    for name in (*names, "val_epoch_010.json", "test_epoch_005_step_0000099.json"):
        aligned_summary(tmp_path / "run" / "version_0" / "layerwise" / name)
    assert latest_summary(tmp_path / "run").name == "val_epoch_010.json"  # older names still read, by number
    (tmp_path / "run" / "version_0" / "layerwise" / "val_epoch_010.json").unlink()
    assert latest_summary(tmp_path / "run").name == "val_epoch_002_step_0000030.json"


def test_sweep_bad_input_names_the_argument(tmp_path, capsys) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    no_early_exit = tmp_path / "plain.json"
    no_early_exit.write_text(json.dumps({"layers": [1], "accuracy": [0.5]}))
    good = tmp_path / "run" / "layerwise" / "val_epoch_000.json"
    aligned_summary(good)
    for argv, needle in [
        ([str(tmp_path / "missing")], "RUN_OR_JSON"),
        ([str(empty)], "RUN_OR_JSON"),
        ([str(no_early_exit)], "early_exit"),
        ([str(good), "--labels", "a", "b"], "--labels"),
        ([str(good), "--format", "gif"], "--format"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            main([*argv, "--out", str(tmp_path / "out")])
        assert exit_info.value.code == 2 and needle in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_threshold_labels_never_overlap():
    from layerwise.commands.sweep import Curve

    rows = [
        {"threshold": round(0.5 + 0.01 * i, 2), "accuracy": 0.9 + 0.0001 * i, "speedup": 2.0 - 0.001 * i}
        for i in range(30)
    ]
    wide = [{"threshold": t, "accuracy": 0.5 + 0.5 * t, "speedup": 4.0 - 3.0 * t} for t in (0.1, 0.5, 0.99)]
    figure = sweep_figure([Curve("dense", "early_exit", rows), Curve("wide", "early_exit", wide)])
    renderer = figure.canvas.get_renderer()
    boxes = [text.get_window_extent(renderer) for text in figure.axes[0].texts]
    assert 1 <= len(boxes) < len(rows) + len(wide)  # crowded points: some labels left to the table
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])


def test_close_thresholds_both_keep_their_label():
    """τ = 0.95 and 0.99 often exit at almost the same point: the 0.99 label moves aside instead of vanishing."""
    from layerwise.commands.sweep import Curve

    rows = [
        {"threshold": 0.9, "accuracy": 0.95, "speedup": 1.60},
        {"threshold": 0.95, "accuracy": 0.962, "speedup": 1.45},
        {"threshold": 0.99, "accuracy": 0.963, "speedup": 1.44},
    ]
    figure = sweep_figure([Curve("run", "early_exit", rows)])
    labels = sorted(text.get_text() for text in figure.axes[0].texts)
    assert labels == ["0.9", "0.95", "0.99"]
    renderer = figure.canvas.get_renderer()
    boxes = [text.get_window_extent(renderer) for text in figure.axes[0].texts]
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1 :])
