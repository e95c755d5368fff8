"""LayerSimilarityMonitor's further measures in a real validation: JSON, scalars and figures, against numpy."""

import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import DEPTH, assert_json_close, fitted_module, read_features, read_summary, trainer, val_loader

from layerwise.callbacks import LayerSimilarityMonitor, LayerwiseAnalysis
from layerwise.metrics.functional_family import MEASURES

sys.path.insert(0, str(Path(__file__).parents[1] / "metrics"))
import _family_reference as ref  # noqa: E402

N = 101  # 6 batches of 16 and a ragged one of 5
PACKAGE_ANALYSES = ("similarity", "logit_lens", "neural_collapse", "depth", "trajectory")  # as test_callbacks.py


def alone(analysis, **options) -> LayerwiseAnalysis:
    """LayerwiseAnalysis running only ``analysis`` (the package's other analyses off)."""
    return LayerwiseAnalysis(
        **{name: analysis if name == analysis.name else False for name in PACKAGE_ANALYSES}, **options
    )


def test_measures_in_the_summary_equal_numpy_on_the_saved_features(tmp_path):
    monitor = LayerSimilarityMonitor(measures=list(MEASURES), shape_alpha=0.25, svcca_variance=0.9)
    trainer(tmp_path, [alone(monitor, save_features=True, log_figures=False)]).validate(
        fitted_module(), val_loader(N), verbose=False
    )
    summary, h = read_summary(tmp_path), read_features(tmp_path)["features"].double().numpy()
    assert h.shape[:2] == (DEPTH, N)
    options = {"svcca_variance": 0.9, "shape_alpha": 0.25, "rank_spectrum": "singular", "pairs": "all"}
    assert summary["measure_options"] == options
    off = ~np.eye(DEPTH, dtype=bool)
    for name in [name for name in MEASURES if name != "effective_rank"]:
        if name == "shape":
            expected = np.array([[ref.shape_distance(x, y, 0.25) for y in h] for x in h])
        elif name == "svcca":
            expected = np.array([[ref.svcca(x, y, 0.9) for y in h] for x in h])
        else:
            expected = np.array([[ref.PAIR[name](x, y) for y in h] for x in h])
        values = np.array(summary[name], dtype=float)
        np.testing.assert_allclose(values[off], expected[off], rtol=0, atol=1e-9, err_msg=name)
    assert_json_close(summary["effective_rank"], [ref.effective_rank(x) for x in h], atol=1e-9, where="rank")


def test_measures_are_off_by_default_and_need_the_exact_cka(tmp_path):
    assert LayerSimilarityMonitor().measures == ()
    with pytest.raises(ValueError, match="cka='exact'"):
        LayerSimilarityMonitor(cka="minibatch", measures=["cca"])
    with pytest.raises(ValueError, match="`measures` 'cka'"):
        LayerSimilarityMonitor(measures=["cka"])


def test_scalars_charts_and_figures_of_the_measures():
    from layerwise.figures.summary import similarity_figures

    monitor = LayerSimilarityMonitor(measures=["procrustes", "effective_rank"])
    charts = monitor.layer_charts()
    assert charts["effective rank"] == r"effective_rank/layer_\d+"
    assert r"procrustes_to_last/layer_\d+" in charts.values()
    matrix = [[0.0, 0.5], [0.5, 0.0]]
    figures = similarity_figures({"layers": [1, 2], "procrustes": matrix, "effective_rank": [3.0, 2.5]})
    assert {"procrustes", "effective_rank"} <= set(figures)


def test_pairs_to_last_keeps_and_computes_only_the_last_column(tmp_path, capfd):
    from layerwise.analyses.pool import Pool
    from layerwise.callbacks.analysis import _gb
    from layerwise.errors import UsageError

    monitor = LayerSimilarityMonitor(measures=["cca", "procrustes"], pairs="to_last")
    trainer(tmp_path, [alone(monitor, save_features=True, log_figures=False)]).validate(
        fitted_module(), val_loader(N), verbose=False
    )
    summary, h = read_summary(tmp_path), read_features(tmp_path)["features"].double().numpy()
    # the memory line before the run: the blocks of the pairs (l, L), 2L - 1 of (d, d), not (L d)^2
    said = capfd.readouterr()
    line = next(line for line in (said.out + said.err).splitlines() if "the statistics hold" in line)
    layers, dim = monitor.spec.num_layers, monitor.spec.dim
    size = Pool.of([monitor], monitor.spec)[0].state_bytes()["pair_moments(pairs=to_last)"]
    assert size == 8 * ((2 * layers - 1) * dim**2 + 2 * layers * dim + 1)  # blocks, feature_sum, shift, count
    assert f"pair_moments(pairs=to_last) {_gb(size)}" in line
    with pytest.raises(UsageError, match="pairs='to_last'"):
        trainer(tmp_path / "refused", [alone(monitor, log_figures=False, max_state_bytes=1000)]).validate(
            fitted_module(), val_loader(N), verbose=False
        )
    assert summary["measure_options"]["pairs"] == "to_last"
    for name in ("cca", "procrustes"):
        values = np.array(summary[name], dtype=float)
        assert np.isnan(values[:, :-1]).all() and np.isfinite(values[:, -1]).all()
    # the CKA from the blocks of the pairs (l, L): the last row and column and the diagonal, null elsewhere
    cka = np.array(summary["cka"], dtype=float)
    kept = np.eye(DEPTH, dtype=bool)
    kept[:, -1] = kept[-1, :] = True
    assert np.isnan(cka[~kept]).all()
    x = h - h.mean(axis=1, keepdims=True)
    expected = [
        np.linalg.norm(a.T @ x[-1]) ** 2 / (np.linalg.norm(a.T @ a) * np.linalg.norm(x[-1].T @ x[-1])) for a in x
    ]
    np.testing.assert_allclose(cka[:, -1], expected, rtol=0, atol=1e-10)
    with pytest.raises(ValueError, match="pairs='some'"):
        LayerSimilarityMonitor(measures=["cca"], pairs="some")
    with pytest.raises(ValueError, match=r"measure_pairs='adjacent'\): renamed `pairs`.*: give pairs='adjacent'\.$"):
        LayerSimilarityMonitor(measure_pairs="adjacent")


def test_heatmap_hatches_the_pairs_not_computed():
    from layerwise.figures.summary import similarity_figures

    nan = float("nan")
    matrix = [[1.0, nan, 0.4], [nan, 1.0, 0.7], [0.4, 0.7, 1.0]]
    summary = {"layers": [1, 2, 3], "cka": matrix, "cca": [[nan, nan, 0.3], [nan, nan, 0.6], [nan, nan, 1.0]]}
    summary["analyses"] = {"similarity": {"options": {"cka": "exact", "pairs": "to_last"}}}
    figures = similarity_figures(summary)
    for key in ("cka", "cca"):
        ax = figures[key].axes[0]
        assert ax.patch.get_hatch() == "////" and "hatched: not computed (pairs=to_last)" in ax.get_xlabel()
        image = ax.images[0].get_array()
        assert image.mask[0, 1] and not image.mask[0, 2]  # the missing cell is no value, not a 0
    full = similarity_figures({"layers": [1, 2], "cka": [[1.0, 0.5], [0.5, 1.0]]})["cka"].axes[0]
    assert not full.patch.get_hatch() and "hatched" not in full.get_xlabel()


def test_pairs_adjacent_logs_each_layer_against_the_next(tmp_path):
    monitor = LayerSimilarityMonitor(measures=["cca", "effective_rank"], pairs="adjacent")
    trainer(tmp_path, [alone(monitor, log_figures=False)]).validate(fitted_module(), val_loader(N), verbose=False)
    summary = read_summary(tmp_path)
    cka, cca = np.array(summary["cka"], dtype=float), np.array(summary["cca"], dtype=float)
    scalars = monitor.layer_scalars(
        {
            key: summary[key] if key == "effective_rank" else np.array(summary[key], dtype=float)
            for key in ("cos", "cka", "cca", "effective_rank")
        }
    )
    for layer in range(DEPTH - 1):
        key = monitor.spec.key(monitor.spec.layer_numbers[layer])
        assert scalars[f"cka_to_next/{key}"] == cka[layer, layer + 1] and np.isfinite(cka[layer, layer + 1])
        assert scalars[f"cca_to_next/{key}"] == cca[layer, layer + 1]
    assert not any(name.startswith(("cka_to_last", "cca_to_last")) for name in scalars)
    charts = monitor.layer_charts()
    assert charts["CKA to next layer"] == r"cka_to_next/layer_\d+" and charts["COS to last layer"]
    assert LayerSimilarityMonitor(cka="minibatch", pairs="adjacent").layer_charts()["CKA to last layer"]
