"""Mutual k-NN and CKNNA in a real validation: the sampled rows, JSON, scalars and figures, batch-size independent."""

import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import DEPTH, fitted_module, read_features, read_summary, trainer, val_loader

from layerwise.callbacks import LayerSimilarityMonitor, LayerwiseAnalysis
from layerwise.results import check_summary

sys.path.insert(0, str(Path(__file__).parents[1] / "metrics"))
from _neighbour_reference import cknna, mutual_knn, sampled_indices  # noqa: E402

N, SIZE, K, SEED = 101, 40, 5, 3
PACKAGE_ANALYSES = ("similarity", "logit_lens", "neural_collapse", "depth", "trajectory")


def alone(analysis, **options) -> LayerwiseAnalysis:
    return LayerwiseAnalysis(
        **{name: analysis if name == analysis.name else False for name in PACKAGE_ANALYSES}, **options
    )


def monitor(**options) -> LayerSimilarityMonitor:
    return LayerSimilarityMonitor(
        measures=["mutual_knn", "cknna"], knn_k=K, knn_sample_size=SIZE, knn_seed=SEED, cos_bins=0, **options
    )


def validate(root: Path, batch_size: int, **options) -> dict:
    trainer(root, [alone(monitor(**options), save_features=True, log_figures=False)]).validate(
        fitted_module(), val_loader(N, batch_size), verbose=False
    )
    return read_summary(root)


def test_measures_equal_numpy_on_the_sampled_rows_for_any_batch_size(tmp_path):
    summary = validate(tmp_path / "16", 16)
    check_summary(summary)
    h = read_features(tmp_path / "16")["features"].double().numpy()[:, sampled_indices(N, SIZE, SEED)]
    assert h.shape[:2] == (DEPTH, SIZE)
    options = summary["measure_options"]
    assert (options["knn_k"], options["knn_sample_size"], options["knn_seed"], options["knn_rows"]) == (
        K,
        SIZE,
        SEED,
        SIZE,
    )
    for name, function in (("mutual_knn", mutual_knn), ("cknna", cknna)):
        expected = np.array([[function(x, y, K) for y in h] for x in h])
        np.testing.assert_allclose(np.array(summary[name], dtype=float), expected, rtol=0, atol=1e-10, err_msg=name)
    other = validate(tmp_path / "7", 7)  # other batches, an uneven last one: the same rows, the same values
    for name in ("mutual_knn", "cknna"):
        assert other[name] == summary[name], name


def test_neighbour_measures_are_off_by_default_scalars_figures_and_options(tmp_path):
    from layerwise.figures.summary import similarity_figures

    assert LayerSimilarityMonitor().measures == ()
    analysis = LayerSimilarityMonitor(measures=["cknna", "mutual_knn"], cka="none")  # no CKA sums needed
    assert analysis.measures == ("mutual_knn", "cknna")
    assert r"cknna_to_last/layer_\d+" in analysis.layer_charts().values()
    figures = similarity_figures({"layers": [1, 2], "mutual_knn": [[1.0, 0.5], [0.5, 1.0]], "cknna": [[1, 0], [0, 1]]})
    assert {"mutual_knn", "cknna"} <= set(figures)
    with pytest.raises(ValueError, match="knn_k=1"):
        LayerSimilarityMonitor(measures=["cknna"], knn_k=1)
    with pytest.raises(ValueError, match="knn_sample_size=0"):
        LayerSimilarityMonitor(measures=["mutual_knn"], knn_sample_size=0)
    with pytest.raises(ValueError, match="`measures` 'knn'"):
        LayerSimilarityMonitor(measures=["knn"])
    from layerwise.analyses.layer_spec import LayerSpec
    from layerwise.errors import UsageError

    with pytest.raises(UsageError, match="one row per sample.*`measures`"):  # a language model's token rows
        analysis.statistics(LayerSpec([1, 2], 2, 8, 50, token_level=True))


def test_to_last_pairs_only(tmp_path):
    summary = validate(tmp_path, 16, pairs="to_last")
    for name in ("mutual_knn", "cknna"):
        values = np.array(summary[name], dtype=float)
        assert np.isnan(values[:, :-1]).all() and np.isfinite(values[:, -1]).all()


# 101 samples in batches of 16 on 2 (3) ranks: DistributedSampler interleaves the indices and pads the last rank(s);
# every rank ends on a ragged batch. The sampled rows are chosen by dataset index, so the values match one process.
@pytest.mark.parametrize("devices", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_processes_match_one_process(tmp_path, single_thread, devices):
    import torch

    weights = tmp_path / "weights.pt"
    torch.save(fitted_module().state_dict(), weights)

    def run(root, **options):
        module = fitted_module()
        module.load_state_dict(torch.load(weights))
        trainer(root, [alone(monitor(), log_figures=False)], **options).validate(module, val_loader(N), verbose=False)
        return read_summary(root)

    one = run(tmp_path / "one")
    many = run(tmp_path / "many", devices=devices, strategy="ddp_fork")
    assert many["measure_options"] == one["measure_options"]
    for name in ("mutual_knn", "cknna"):
        np.testing.assert_allclose(np.array(many[name]), np.array(one[name]), rtol=0, atol=1e-6, err_msg=name)


def test_the_statistics_memory_is_said_and_refused_beyond_max_state_bytes(tmp_path, capfd):
    from layerwise.analyses.pool import Pool
    from layerwise.callbacks.analysis import _gb
    from layerwise.errors import UsageError

    analysis = monitor()
    trainer(tmp_path / "said", [alone(analysis, log_figures=False)]).validate(
        fitted_module(), val_loader(N), verbose=False
    )
    said = capfd.readouterr()
    lines = [line for line in (said.out + said.err).splitlines() if "the statistics hold" in line]
    assert len(lines) == 1 and "budget none" in lines[0], lines
    spec = analysis.spec
    sizes = Pool.of([analysis], spec)[0].state_bytes()
    layers, dim = spec.num_layers, spec.dim
    expected = 8 * (2 * layers * dim + (layers * dim) ** 2 + 1)  # LayerCKA: feature_sum, shift, cross, count
    assert sizes["stacked_moments"] == expected
    assert sizes[f"row_sample(size={SIZE}, seed={SEED})"] == 8 * layers * SIZE * dim + 16 * SIZE
    assert f"hold {_gb(sum(sizes.values()))} per" in lines[0]
    with pytest.raises(UsageError, match="more than max_state_bytes=1000 .*`max_state_bytes`"):
        trainer(tmp_path / "refused", [alone(monitor(), log_figures=False, max_state_bytes=1000)]).validate(
            fitted_module(), val_loader(N), verbose=False
        )
