"""The analysis callbacks end to end on a tiny timm ViT: every JSON value against an independent float64 numpy
reference computed from the saved features, the TensorBoard output, scheduling, layer selection, state size and
the standalone monitors.
"""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from helpers import (
    CLASSES,
    DEPTH,
    DIM,
    assert_json_close,
    digits,
    fitted_module,
    head64,
    read_features,
    read_summary,
    train_loader,
    trainer,
    val_loader,
)
from lightning.pytorch import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.custom_scalar import layout_pb2
from torch import Tensor
from torch.utils.data import DataLoader, TensorDataset

from layerwise.analyses.effective_depth import DEFAULT_EPSILONS
from layerwise.analyses.logit_lens import DEFAULT_THRESHOLDS
from layerwise.callbacks import (
    EffectiveDepthMonitor,
    LayerSimilarityMonitor,
    LayerwiseAnalysis,
    LogitLensMonitor,
    NeuralCollapseMonitor,
    _loader,
)
from layerwise.cli import main
from layerwise.features import TimmViT
from layerwise.lightning_modules import Standard
from layerwise.results import REQUIRED_KEYS, find_summaries

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
N = 101  # validation samples: 6 batches of 16 and a ragged one of 5
THRESHOLDS = [0.3, 0.5, 0.7, 0.9]
EPSILONS = [0.01, 0.05, 0.1]
HEADER = {
    *("stage", "split", "epoch", "global_step", "num_samples", "depth", "layers", "run_id", "n_nonfinite"),
    "layerwise_version",
    "figure_functions",
    "analyses",
}


# ---------------------------------------------------------------------------------------- float64 references
def softmax64(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Probabilities and log-probabilities over the last axis."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_prob = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    return np.exp(log_prob), log_prob


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def ref_cos(h: np.ndarray) -> np.ndarray:
    """C[a, b] = mean_i cos(h_i^a - mu^a, h_i^b - mu^b), sample by sample."""
    x = h - h.mean(axis=1, keepdims=True)
    layers, n = h.shape[:2]
    return np.array(
        [[np.mean([cosine(x[a, i], x[b, i]) for i in range(n)]) for b in range(layers)] for a in range(layers)]
    )


def ref_cos_distribution(h: np.ndarray) -> dict:
    """The per-sample cosines' quantiles (numpy), negative fraction and histogram of COS(h_l, h_L) on 400 bins."""
    x = h - h.mean(axis=1, keepdims=True)
    layers, n = h.shape[:2]
    cosines = np.array([[[cosine(x[a, i], x[b, i]) for i in range(n)] for b in range(layers)] for a in range(layers)])
    levels = [0.0, 0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99, 1.0]
    to_last = np.clip(cosines[:, -1], -1, 1)  # the last layer's own cosine is 1 +- 1 ulp
    return {
        "cos_quantile_levels": levels,
        "cos_quantiles": np.moveaxis(np.quantile(cosines, levels, axis=-1), 0, -1).tolist(),
        "cos_negative_fraction": (cosines < 0).mean(axis=-1).tolist(),
        "cos_histogram_to_last": [np.histogram(c, bins=400, range=(-1, 1))[0].tolist() for c in to_last],
    }


def ref_cka(h: np.ndarray) -> np.ndarray:
    """Linear CKA from centred Gram matrices: HSIC(K, L) ~ tr(HKH HLH)."""
    n = h.shape[1]
    centering = np.eye(n) - np.ones((n, n)) / n
    grams = [centering @ (x @ x.T) @ centering for x in h]
    hsic = np.array([[np.sum(ka * kb) for kb in grams] for ka in grams])
    return hsic / np.sqrt(np.outer(np.diag(hsic), np.diag(hsic)))


def ref_saturation(predictions: np.ndarray) -> np.ndarray:
    """0-based saturation layer: walk down from the last layer while the prediction stays the last one."""
    layers = predictions.shape[0]
    result = []
    for column in predictions.T:
        layer = layers - 1
        while layer > 0 and column[layer - 1] == column[-1]:
            layer -= 1
        result.append(layer)
    return np.array(result)


def ref_saturation_cos(h: np.ndarray, saturation: np.ndarray) -> list:
    mean = h.mean(axis=1)
    result = []
    for layer in range(h.shape[0]):
        samples = np.flatnonzero(saturation == layer)
        cos = [cosine(h[layer, i] - mean[layer], h[-1, i] - mean[-1]) for i in samples]
        result.append(float(np.mean(cos)) if cos else None)
    return result


def ref_nc1(h: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """(1/K) tr(Sigma_W pinv(Sigma_B)) over the classes present, Sigma_B around the mean of the class means."""
    classes = np.unique(labels)
    result = []
    for x in h:
        means = np.stack([x[labels == k].mean(axis=0) for k in classes])
        within = sum((x[labels == k] - m).T @ (x[labels == k] - m) for k, m in zip(classes, means)) / len(labels)
        spread = means - means.mean(axis=0)
        between = spread.T @ spread / len(classes)
        result.append(np.trace(within @ np.linalg.pinv(between, hermitian=True, rtol=1e-10)) / len(classes))
    return np.array(result)


def ref_effective_depth(accuracy: np.ndarray, numbers: list[int], relative: bool) -> dict[str, int]:
    result = {}
    for eps in EPSILONS:
        target = accuracy[-1] - eps if relative else 1.0 - eps
        result[str(eps)] = next((n for n, a in zip(numbers, accuracy) if a >= target), numbers[-1])
    return result


def ref_early_exit(prob: np.ndarray, labels: np.ndarray, numbers: list[int], depth: int) -> list[dict]:
    confidence, predictions = prob.max(axis=-1), prob.argmax(axis=-1)
    layers, n = confidence.shape
    rows = []
    for tau in THRESHOLDS:
        exits = [next((layer for layer in range(layers) if confidence[layer, i] >= tau), layers - 1) for i in range(n)]
        rows.append(
            {
                "threshold": tau,
                "accuracy": float(np.mean([predictions[e, i] == labels[i] for i, e in enumerate(exits)])),
                "exit_counts": np.bincount(exits, minlength=layers).tolist(),
                "speedup": depth * n / sum(numbers[e] for e in exits),
            }
        )
    return rows


def ref_trajectory(h: np.ndarray) -> dict:
    """LSS, expodistance and step statistics of every sample's path x^1..x^L, with loops over the definitions."""
    steps = h[1:] - h[:-1]  # (L-1, N, d)
    norms = np.linalg.norm(steps, axis=-1)
    lss, ed, cv = [], [], []
    for i in range(h.shape[1]):
        walk = h[0, i].copy()
        for step in range(steps.shape[0]):
            walk += steps[step, i] / norms[step, i]
        lss.append(steps.shape[0] / np.linalg.norm(walk - h[0, i]))
        beta = norms[1:, i] / norms[:-1, i]
        ed.append(beta.std() / beta.mean())
        cv.append(norms[:, i].std() / norms[:, i].mean())
    return {
        "trajectory_lss": float(np.mean(lss)),
        "trajectory_expodistance": float(np.mean(ed)),
        "trajectory_step_variation": float(np.mean(cv)),
        "trajectory_step_norm": norms.mean(axis=1).tolist(),
        "trajectory_step_ratio": (norms[1:] / norms[:-1]).mean(axis=1).tolist(),
    }


def ref_lens_statistics(logits: np.ndarray) -> dict:
    """KL(p_L || p_l), entropy of p_l and the 1-based rank of the last layer's top-1 class, each layer's mean."""
    prob, log_prob = softmax64(logits)
    kl = (prob[-1] * (log_prob[-1] - log_prob)).sum(axis=-1)
    entropy = -(prob * log_prob).sum(axis=-1)
    top = prob[-1].argmax(axis=-1)
    ranks = np.array(
        [[1 + sum(p[c] > p[top[i]] for c in range(len(p))) for i, p in enumerate(layer)] for layer in prob]
    )
    return {
        "kl_to_final": kl.mean(axis=1).tolist(),
        "entropy": entropy.mean(axis=1).tolist(),
        "final_rank": ranks.mean(axis=1).tolist(),
    }


def reference(h: np.ndarray, labels: np.ndarray, logits: np.ndarray, numbers: list[int]) -> dict:
    """Every JSON value of ``LayerwiseAnalysis`` from features (L, N, d) and float64 logits (L, N, C)."""
    prob, log_prob = softmax64(logits)
    predictions = prob.argmax(axis=-1)
    accuracy = (predictions == labels).mean(axis=1)
    saturation = ref_saturation(predictions)
    return {
        "cos": ref_cos(h).tolist(),
        **ref_cos_distribution(h),
        "cka": ref_cka(h).tolist(),
        "accuracy": accuracy.tolist(),
        "loss": (-np.take_along_axis(log_prob, labels[None, :, None], axis=-1)[..., 0].mean(axis=1)).tolist(),
        "saturation_counts": np.bincount(saturation, minlength=len(numbers)).tolist(),
        "saturation_cos": ref_saturation_cos(h, saturation),
        "nc1": ref_nc1(h, labels).tolist(),
        "effective_depth": ref_effective_depth(accuracy, numbers, relative=False),
        "effective_depth_reached": {str(eps): bool(any(a >= 1.0 - eps for a in accuracy)) for eps in EPSILONS},
        "effective_depth_relative": ref_effective_depth(accuracy, numbers, relative=True),
        "early_exit": ref_early_exit(prob, labels, numbers, DEPTH),
        **ref_lens_statistics(logits),
        **(ref_trajectory(h) if numbers == list(range(1, DEPTH + 1)) else {}),
    }


# ------------------------------------------------------------------------------------------------- the run
@pytest.fixture(scope="module")
def analysis_run(tmp_path_factory):
    """One validation of the fitted tiny ViT with every family on and ``save_features=True``."""
    root = tmp_path_factory.mktemp("analysis")
    module = fitted_module()
    callback = LayerwiseAnalysis(
        save_features=True,
        logit_lens=LogitLensMonitor(thresholds=THRESHOLDS),
        depth=EffectiveDepthMonitor(epsilons=EPSILONS),
    )
    trainer(root, [callback]).validate(module, val_loader(N), verbose=False)
    saved = read_features(root)
    h = saved["features"].double().numpy()
    logits = head64(module.backbone)(h).numpy()
    return read_summary(root), saved, h, logits


def test_analysis_json_equals_float64_reference(analysis_run):
    summary, saved, h, logits = analysis_run
    _, _, x, y = digits()
    labels = y[:N].numpy()

    # the saved file holds the real features of the real samples, in dataset order
    assert saved["features"].dtype == torch.float32 and saved["features"].shape == (DEPTH, N, DIM)
    assert saved["labels"].tolist() == labels.tolist()
    with torch.no_grad():
        torch.testing.assert_close(saved["features"], fitted_module().backbone(x[:N]), rtol=0, atol=1e-5)
    prob = softmax64(logits)[0]
    assert saved["predictions"].tolist() == prob.argmax(-1).tolist()
    np.testing.assert_allclose(saved["max_prob"].numpy(), prob.max(-1), atol=1e-5)

    # inputs that exercise every branch: varied predictions, confidences and saturation layers
    assert len(np.unique(prob.argmax(-1))) >= 5 and 0.1 < (prob.max(-1) >= 0.7).mean() < 0.9
    expected = reference(h, labels, logits, list(range(1, DEPTH + 1)))
    assert sum(count > 0 for count in expected["saturation_counts"]) >= 3

    assert {key: summary[key] for key in HEADER - {"run_id", "layerwise_version", "figure_functions", "analyses"}} == {
        "stage": "val",
        "split": "validation",
        "epoch": 0,
        "global_step": 0,
        "num_samples": N,
        "depth": DEPTH,
        "layers": [1, 2, 3, 4],
        "n_nonfinite": 0,
    }
    assert set(summary) == HEADER | set(expected)
    for key in ("cos", "cka", "accuracy", "saturation_counts", "saturation_cos", "effective_depth"):
        assert_json_close(summary[key], expected[key], atol=1e-9, where=key)
    for key in ("kl_to_final", "entropy", "final_rank"):  # the head in float32 against float64: to 1e-5
        assert_json_close(summary[key], expected[key], atol=1e-5, where=key)
    assert summary["kl_to_final"][-1] == 0.0 and summary["final_rank"][-1] == 1.0
    for key in ("effective_depth_relative", "early_exit", "cos_negative_fraction", "cos_quantile_levels"):
        assert_json_close(summary[key], expected[key], atol=1e-12, where=key)
    assert summary["effective_depth_reached"] == expected["effective_depth_reached"]
    assert summary["cos_histogram_to_last"] == expected["cos_histogram_to_last"]
    assert_json_close(summary["cos_quantiles"], expected["cos_quantiles"], atol=1 / 400 + 1e-9, where="cos_quantiles")
    assert_json_close(summary["nc1"], expected["nc1"], rtol=1e-8, where="nc1")
    for key in [key for key in expected if key.startswith("trajectory_")]:
        assert_json_close(summary[key], expected[key], rtol=1e-9, where=key)
    # float32 logits of the module versus float64 logits recomputed here
    assert_json_close(summary["loss"], expected["loss"], rtol=1e-5, where="loss")


# ----------------------------------------------------------------------------------------- what the user sees
def test_each_validation_prints_the_per_layer_table_and_the_summary_path(tmp_path, capsys):
    trainer(tmp_path, [LayerwiseAnalysis(log_figures=False)]).validate(fitted_module(), val_loader(N), verbose=False)
    out = capsys.readouterr().out
    summary, path = read_summary(tmp_path), find_summaries(tmp_path)[0]
    lines = out.splitlines()
    start = lines.index("layerwise validation, epoch 0, step 0:")
    assert lines[start + 1].split() == ["layer", "accuracy", "COS", "to", "last", "CKA", "to", "last", "NC1"]
    for layer in range(DEPTH):
        cells = lines[start + 2 + layer].split()
        expected = [summary["accuracy"][layer], summary["cos"][layer][-1], summary["cka"][layer][-1]]
        expected.append(summary["nc1"][layer])
        assert cells == [str(layer + 1), *(f"{value:.4f}" for value in expected)]
    assert lines[start + 2 + DEPTH] == f"-> {path}"
    trainer(tmp_path / "quiet", [LayerwiseAnalysis(print_table=False)]).validate(fitted_module(), val_loader(N))
    assert "layerwise val" not in capsys.readouterr().out


def test_every_custom_scalars_chart_refers_to_logged_tags(tmp_path):
    logger = TensorBoardLogger(str(tmp_path), name="tb")
    fit = trainer(tmp_path, [LayerwiseAnalysis()], logger=logger, max_epochs=1, limit_train_batches=2)
    fit.fit(fitted_module(), train_loader(), val_loader(N))
    events = EventAccumulator(logger.log_dir, size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    (config,) = events.Tensors("custom_scalars__config__")
    layout = layout_pb2.Layout.FromString(config.tensor_proto.string_val[0])
    tags = set(events.Tags()["scalars"])
    series = [*(Path(logger.log_dir) / "layers").iterdir(), *(Path(logger.log_dir) / "thresholds").iterdir()]
    for folder in series:  # TensorBoard's run per layer and per threshold (the charts read them)
        layer_run = EventAccumulator(str(folder), size_guidance={"scalars": 0})
        layer_run.Reload()
        tags |= set(layer_run.Tags()["scalars"])
    assert [category.title for category in layout.category] == ["layerwise val"]  # no test charts without a test
    titles = [chart.title for category in layout.category for chart in category.chart]
    assert not any("perplexity" in title or "F1" in title for title in titles)  # not logged for this model
    for category in layout.category:
        for chart in category.chart:
            (pattern,) = chart.multiline.tag
            assert [tag for tag in tags if re.fullmatch(pattern, tag)], f"{chart.title}: no logged tag"


# ----------------------------------------------------------------------------------------- non-finite samples
@pytest.mark.parametrize("group_batches", [1, 3, _loader.GROUP_BATCHES])
def test_non_finite_samples_are_skipped_counted_and_named_never_poisoning_others(tmp_path, monkeypatch, group_batches):
    # fed a batch at a time, in groups of three (the bad rows in three groups), and all seven batches in one group
    monkeypatch.setattr(_loader, "GROUP_BATCHES", group_batches)
    x, y = val_loader(N).dataset.tensors
    poisoned = x.clone()
    bad = [5, 40, 77]
    poisoned[bad[0], 0, 0, 0] = float("nan")
    poisoned[bad[1]] = float("inf")
    poisoned[bad[2], 0, 3] = float("nan")
    keep = torch.ones(N, dtype=torch.bool)
    keep[bad] = False
    module = fitted_module()
    dirty_dir, clean_dir = tmp_path / "dirty", tmp_path / "clean"
    dirty = DataLoader(TensorDataset(poisoned, y), batch_size=16)
    clean = DataLoader(TensorDataset(x[keep], y[keep]), batch_size=16)
    with pytest.warns(UserWarning, match=r"skipped 3 val samples with non-finite values .*\{1: 3, 2: 3, 3: 3, 4: 3\}"):
        trainer(dirty_dir, [LayerwiseAnalysis(log_figures=False)]).validate(module, dirty, verbose=False)
    trainer(clean_dir, [LayerwiseAnalysis(log_figures=False)]).validate(module, clean, verbose=False)
    with_nan, without = read_summary(dirty_dir), read_summary(clean_dir)
    assert with_nan["n_nonfinite"] == 3 and without["n_nonfinite"] == 0 and with_nan["num_samples"] == N - 3
    with_nan.pop("n_nonfinite"), without.pop("n_nonfinite")
    assert_json_close(with_nan, without, atol=1e-9, rtol=1e-4)  # as if absent (float32 forward of other batches)

    # and a fit with such a validation set runs to its end
    fit = trainer(tmp_path / "fit", [LayerwiseAnalysis(log_figures=False)], max_epochs=2, limit_train_batches=2)
    with pytest.warns(UserWarning, match="non-finite"):
        fit.fit(fitted_module(), train_loader(), dirty)
    assert fit.current_epoch == 2 and read_summary(tmp_path / "fit", epoch=1)["n_nonfinite"] == 3


@pytest.mark.parametrize("group_batches", [1, _loader.GROUP_BATCHES])
def test_minibatch_cka_is_taken_per_dataloader_batch_whatever_the_grouping(tmp_path, monkeypatch, group_batches):
    # The minibatch HSIC is an estimator per dataloader batch: its loader is fed batch by batch, never joined.
    from helpers import ref_unbiased_hsic

    monkeypatch.setattr(_loader, "GROUP_BATCHES", group_batches)
    callback = LayerwiseAnalysis(similarity=LayerSimilarityMonitor(cka="minibatch"), log_figures=False)
    trainer(tmp_path, [callback]).validate(fitted_module(), val_loader(N), verbose=False)
    backbone, hsic = fitted_module().backbone, np.zeros((DEPTH, DEPTH))
    for x, _ in val_loader(N):  # 6 batches of 16 and one of 5, each its own estimate
        with torch.no_grad():
            h = backbone(x).double().numpy()
        hsic += np.array([[ref_unbiased_hsic(h[a], h[b]) for b in range(DEPTH)] for a in range(DEPTH)])
    expected = hsic / np.sqrt(np.outer(np.diag(hsic), np.diag(hsic)))
    np.testing.assert_allclose(read_summary(tmp_path)["cka"], expected, rtol=0, atol=1e-9)


def test_the_last_batch_is_fed_at_the_end_and_a_failed_epoch_leaves_no_batch_behind(tmp_path):
    # The batches are fed in groups, each when the next is joined (its non-finite check travels to the host
    # meanwhile): the last group, NaN row included, is fed when the states are reduced; an epoch that fails keeps
    # nothing for the next one.
    x, y = val_loader(N).dataset.tensors
    poisoned = x.clone()
    poisoned[99, 0, 0, 0] = float("nan")  # in the ragged last batch
    callback = LayerwiseAnalysis(log_figures=False)
    with pytest.warns(UserWarning, match=r"skipped 1 val samples"):
        trainer(tmp_path / "last", [callback]).validate(
            fitted_module(), DataLoader(TensorDataset(poisoned, y), batch_size=16), verbose=False
        )
    summary = read_summary(tmp_path / "last")
    assert summary["n_nonfinite"] == 1 and summary["num_samples"] == N - 1

    class FailsAtBatch(Standard):
        def validation_step(self, batch, batch_idx):
            if batch_idx == 3:
                raise RuntimeError("boom")
            return super().validation_step(batch, batch_idx)

    failing = FailsAtBatch(fitted_module().backbone)
    with pytest.raises(RuntimeError, match="boom"):
        trainer(tmp_path / "failed", [callback]).validate(failing, val_loader(N), verbose=False)
    assert all(state.pending is None and not state.held for state in callback._states.values())
    trainer(tmp_path / "again", [callback]).validate(fitted_module(), val_loader(N), verbose=False)
    assert read_summary(tmp_path / "again")["num_samples"] == N


# ----------------------------------------------------------------------------------------- loggers and JSON
@pytest.mark.parametrize(("max_steps", "warns"), [(4, False), (3, True)])
def test_a_fit_ending_at_max_steps_is_analysed_or_warned_about(tmp_path, max_steps, warns, recwarn):
    fit = trainer(
        tmp_path,
        [LayerwiseAnalysis(log_figures=False)],
        max_epochs=-1,
        max_steps=max_steps,
        val_check_interval=2,
        check_val_every_n_epoch=None,
        limit_val_batches=1,
    )
    fit.fit(fitted_module(), train_loader(), val_loader(16))
    steps = [json.loads(path.read_text())["global_step"] for path in find_summaries(tmp_path, all_epochs=True)]
    messages = [str(w.message) for w in recwarn if "final model is not analysed" in str(w.message)]
    assert steps == [2, 4] if max_steps == 4 else steps == [2]
    assert bool(messages) == warns
    if warns:
        assert "max_steps=3" in messages[0] and "last validation runs at step 2" in messages[0]


def test_every_config_ending_at_max_steps_ends_on_a_validation():
    for config in sorted(CONFIGS.rglob("*.yaml")):
        options = yaml.safe_load(config.read_text()).get("trainer") or {}
        if not options.get("max_steps"):
            continue
        assert options.get("check_val_every_n_epoch", 1) is None, config
        batches = options["max_steps"] * options.get("accumulate_grad_batches", 1)
        assert batches % options["val_check_interval"] == 0, config


def test_several_validations_per_epoch_each_keep_their_summary(tmp_path, capsys):
    fit = trainer(
        tmp_path,
        [LayerwiseAnalysis(log_figures=False)],
        max_epochs=2,
        limit_train_batches=4,
        val_check_interval=2,
        limit_val_batches=1,
    )
    fit.fit(fitted_module(), train_loader(), val_loader(N))
    files = find_summaries(tmp_path, all_epochs=True)
    contents = [json.loads(path.read_text()) for path in files]
    assert [(c["epoch"], c["global_step"]) for c in contents] == [(0, 2), (0, 4), (1, 6), (1, 8)]
    assert len({json.dumps(c["loss"]) for c in contents}) == 4  # four different models, four results
    main(["plot", str(tmp_path), "--all_epochs", "true", "--format", "png", "--out", str(tmp_path / "figures")])
    printed = [line for line in capsys.readouterr().out.splitlines() if line.endswith("_cos.png")]
    assert [Path(line).name.split("_cos")[0] for line in printed] == [path.stem for path in files]  # step order


@pytest.mark.parametrize("layers", [[-1], [0], [2]])
def test_a_single_analysed_layer_works_for_every_metric(tmp_path, layers):
    module = fitted_module()
    everything, one = tmp_path / "all", tmp_path / "one"
    trainer(everything, [LayerwiseAnalysis(log_figures=False)]).validate(module, val_loader(N), verbose=False)
    logger = TensorBoardLogger(str(one), name="tb")
    trainer(one, [LayerwiseAnalysis(layers=layers)], logger=logger).validate(module, val_loader(N), verbose=False)
    full, single = read_summary(everything), read_summary(logger.log_dir)
    index = layers[0] % DEPTH
    assert single["layers"] == [index + 1] and single["num_samples"] == N
    assert single["cos"] == [[pytest.approx(1.0)]] and single["cka"] == [[pytest.approx(1.0)]]
    for key in ("accuracy", "loss", "nc1"):
        assert single[key] == [pytest.approx(full[key][index], rel=1e-9)], key
    assert sum(single["saturation_counts"]) == N and len(single["saturation_cos"]) == 1
    assert all(len(row["exit_counts"]) == 1 and sum(row["exit_counts"]) == N for row in single["early_exit"])
    assert set(single["effective_depth"].values()) == {index + 1}


def test_a_depth_one_model_is_analysed(tmp_path):
    torch.manual_seed(0)
    backbone = TimmViT(num_classes=10, img_size=8, patch_size=2, in_chans=1, embed_dim=16, depth=1, num_heads=2)
    assert backbone.num_layers == 1
    trainer(tmp_path, [LayerwiseAnalysis(log_figures=False)]).validate(Standard(backbone), val_loader(N), verbose=False)
    summary = read_summary(tmp_path)
    assert summary["layers"] == [1] and len(summary["accuracy"]) == 1 and summary["cos"] == [[pytest.approx(1.0)]]


@pytest.mark.parametrize("layers", [[DEPTH], [-DEPTH - 1], DEPTH + 1])
def test_layers_out_of_range_fail_in_setup_before_training(tmp_path, layers):
    fit = trainer(tmp_path, [LayerwiseAnalysis(layers=layers)], max_epochs=1, limit_train_batches=2)
    with pytest.raises(ValueError, match=rf"LayerwiseAnalysis: `layers.*{DEPTH}"):
        fit.fit(fitted_module(), train_loader(), val_loader(N))
    assert fit.global_step == 0 and not (tmp_path / "layerwise").exists()


def test_figures_are_drawn_at_their_cadence_and_at_the_last_epoch(tmp_path):
    logger = TensorBoardLogger(str(tmp_path), name="tb")
    callback = LayerwiseAnalysis(figures_every_n_epochs=2)
    fit = trainer(tmp_path, [callback], logger=logger, max_epochs=5, limit_train_batches=1, limit_val_batches=1)
    fit.fit(fitted_module(), train_loader(), val_loader(N))
    events = EventAccumulator(logger.log_dir, size_guidance={"images": 0, "scalars": 0})
    events.Reload()
    drawn_at = [event.step for event in events.Images("val/cos")]
    assert drawn_at == [2, 4, 5]  # after epochs 2 and 4 (1-based, steps = global steps), and the last one
    steps_logger = TensorBoardLogger(str(tmp_path), name="steps")  # a max_steps run: max_epochs=-1, last = max_steps
    run = trainer(
        tmp_path / "steps",
        [LayerwiseAnalysis(figures_every_n_epochs=100)],
        logger=steps_logger,
        max_epochs=-1,
        max_steps=4,
        val_check_interval=1,
        check_val_every_n_epoch=None,
        limit_val_batches=1,
    )
    run.fit(fitted_module(), train_loader(), val_loader(N))
    step_events = EventAccumulator(steps_logger.log_dir, size_guidance={"images": 0})
    step_events.Reload()
    assert [event.step for event in step_events.Images("val/cos")] == [4]
    assert len(events.Scalars("val/acc/layer_01")) == 5  # the numbers are logged every epoch
    assert len(sorted((tmp_path / "tb" / "version_0" / "layerwise").glob("val_epoch_*.json"))) == 5
    with pytest.raises(ValueError, match="figures_every_n_epochs"):
        LayerwiseAnalysis(figures_every_n_epochs=0)


def test_fit_writes_tensorboard_images_scalars_layout_and_full_json(tmp_path):
    logger = TensorBoardLogger(str(tmp_path), name="tb")
    fit = trainer(
        tmp_path, [LayerwiseAnalysis()], logger=logger, max_epochs=1, limit_train_batches=2, limit_val_batches=2
    )
    fit.fit(fitted_module(), train_loader(), val_loader(N))

    events = EventAccumulator(logger.log_dir, size_guidance={"images": 0, "scalars": 0, "tensors": 0})
    events.Reload()
    tags = events.Tags()
    assert {"val/cos", "val/cka", "val/saturation", "val/early_exit"} <= set(tags["images"])
    layers = [f"layer_{n:02d}" for n in range(1, DEPTH + 1)]
    per_layer = ("acc", "loss", "nc1", "saturation", "cos_to_last", "cka_to_last")
    expected_scalars = {f"val/{name}/{layer}" for name in per_layer for layer in layers}
    expected_scalars |= {f"val/effective_depth/eps_{eps}" for eps in DEFAULT_EPSILONS}
    expected_scalars |= {f"val/early_exit/speedup/tau_{tau:g}" for tau in DEFAULT_THRESHOLDS}
    assert expected_scalars <= set(tags["scalars"])

    summary = read_summary(logger.log_dir)
    assert summary["num_samples"] == 32 and summary["global_step"] == 2
    (module_event,) = events.Scalars("val/acc")  # logged by the module itself: the per-layer values share its step
    for layer, accuracy in zip(layers, summary["accuracy"]):
        (event,) = events.Scalars(f"val/acc/{layer}")
        assert event.step == module_event.step and event.value == pytest.approx(accuracy, abs=1e-6)

    (config,) = events.Tensors("custom_scalars__config__")
    layout = layout_pb2.Layout.FromString(config.tensor_proto.string_val[0])
    charts = {chart.title: list(chart.multiline.tag) for cat in layout.category for chart in cat.chart}
    for title, name in (("val accuracy per layer", "acc"), ("val NC1 per layer", "nc1")):
        (pattern,) = charts[title]  # the tag of the layer runs: a line per layer, in its run's colour
        assert pattern == f"^val/{name}/layers$"
        for layer in layers:
            layer_run = EventAccumulator(str(Path(logger.log_dir) / "layers" / layer), size_guidance={"scalars": 0})
            layer_run.Reload()
            assert [tag for tag in layer_run.Tags()["scalars"] if re.fullmatch(pattern, tag)] == [f"val/{name}/layers"]

    assert set(REQUIRED_KEYS) <= set(summary)
    for key in ("cos", "cka"):
        assert np.asarray(summary[key]).shape == (DEPTH, DEPTH)
    for key in ("accuracy", "loss", "saturation_counts", "saturation_cos", "nc1"):
        assert len(summary[key]) == DEPTH
    assert sum(summary["saturation_counts"]) == 32
    assert set(summary["effective_depth"]) == {str(eps) for eps in DEFAULT_EPSILONS}
    assert [row["threshold"] for row in summary["early_exit"]] == list(DEFAULT_THRESHOLDS)
    for row in summary["early_exit"]:
        assert set(row) == {"threshold", "accuracy", "exit_counts", "speedup"}
        assert len(row["exit_counts"]) == DEPTH and sum(row["exit_counts"]) == 32 and row["speedup"] >= 1.0


# ------------------------------------------------------------------------------------------------ scheduling
def test_every_n_epochs_skips_epoch_0_and_runs_epoch_1(tmp_path):
    callback = LayerwiseAnalysis(every_n_epochs=2, log_figures=False)
    fit = trainer(tmp_path, [callback], max_epochs=2, limit_train_batches=1, limit_val_batches=1)
    fit.fit(fitted_module(), train_loader(), val_loader(N))
    assert not list((tmp_path / "layerwise").glob("val_epoch_000_*.json"))
    assert read_summary(tmp_path, epoch=1)["epoch"] == 1


class SanityProbe(Callback):
    """Records what the analysis left behind by the end of the sanity check."""

    def on_sanity_check_end(self, trainer, pl_module):
        self.files = sorted(Path(trainer.default_root_dir).rglob("*.json"))
        self.metrics = [key for key in trainer.callback_metrics if "/layer_" in key]


def test_sanity_check_writes_and_logs_nothing(tmp_path):
    probe = SanityProbe()
    callbacks = [LayerwiseAnalysis(log_figures=False), probe]
    fit = trainer(tmp_path, callbacks, max_epochs=1, limit_train_batches=1, limit_val_batches=1, num_sanity_val_steps=1)
    fit.fit(fitted_module(), train_loader(), val_loader(N))
    assert probe.files == [] and probe.metrics == []
    assert read_summary(tmp_path)["num_samples"] == 16  # the callback was live for the real epoch


def test_layers_first_and_last(tmp_path, analysis_run):
    full, _, h, logits = analysis_run
    callback = LayerwiseAnalysis(
        layers=[0, -1],
        logit_lens=LogitLensMonitor(thresholds=THRESHOLDS),
        depth=EffectiveDepthMonitor(epsilons=EPSILONS),
        log_figures=False,
    )
    trainer(tmp_path, [callback]).validate(fitted_module(), val_loader(N), verbose=False)
    summary = read_summary(tmp_path)

    assert summary["layers"] == [1, DEPTH] and summary["depth"] == DEPTH
    pick = [0, DEPTH - 1]
    for key in ("cos", "cka"):
        assert np.asarray(summary[key]).shape == (2, 2)
        np.testing.assert_allclose(summary[key], np.asarray(full[key])[np.ix_(pick, pick)], atol=1e-12)
    for key in ("accuracy", "loss", "nc1"):
        np.testing.assert_allclose(summary[key], np.asarray(full[key])[pick], rtol=1e-12)
    # saturation and early exit run over the selected layers; the speedup counts real layer numbers
    expected = reference(h[pick], digits()[3][:N].numpy(), logits[pick], [1, DEPTH])
    assert summary["saturation_counts"] == expected["saturation_counts"]
    assert_json_close(summary["early_exit"], expected["early_exit"], atol=1e-12)
    assert_json_close(summary["effective_depth"], expected["effective_depth"])
    assert_json_close(summary["effective_depth_relative"], expected["effective_depth_relative"])


class StateProbe(LayerwiseAnalysis):
    """Snapshots the shapes of every metric state just before the epoch's states are reduced and reset."""

    def compute(self, trainer, pl_module):
        self.states = {}
        self._states[0].feed_pending()  # the last batch is fed when the states are reduced: feed it now
        metrics = self._states[0].metrics
        for metric in metrics:
            for name, value in metric.metric_state.items():
                assert isinstance(value, Tensor), f"{type(metric).__name__}.{name} is a list state"
                self.states[f"{type(metric).__name__}.{name}"] = tuple(value.shape)
        self.buffered = {type(m).__name__: m._num_buffered for m in metrics if hasattr(m, "_num_buffered")}
        return super().compute(trainer, pl_module)


def test_metric_states_do_not_grow_with_samples(tmp_path):
    probes = {}
    for batches in (1, 3):
        probes[batches] = StateProbe(log_figures=False)
        trainer(tmp_path / str(batches), [probes[batches]], limit_val_batches=batches).validate(
            fitted_module(), val_loader(N), verbose=False
        )
    assert probes[1].states == probes[3].states
    assert probes[1].states["LayerCKA.cross"] == (DEPTH * DIM, DEPTH * DIM)
    assert probes[1].states["LayerNC1.second_moment"] == (DEPTH, DIM, DIM)
    assert probes[1].states["LayerNC1.class_sums"] == (DEPTH, CLASSES, DIM)
    # only the centred cosines keep samples, and only for the epoch (documented, bounded by max_buffered_samples)
    assert probes[1].buffered == {"LayerCosineSimilarity": 16, "SaturationCosine": 16}
    assert probes[3].buffered == {"LayerCosineSimilarity": 48, "SaturationCosine": 48}


# ------------------------------------------------------------------------------------------ each analysis alone
COS_DISTRIBUTION = {"cos_quantile_levels", "cos_quantiles", "cos_negative_fraction", "cos_histogram_to_last"}
MONITORS = [
    (LayerSimilarityMonitor, {}, {"cos", "cka", *COS_DISTRIBUTION}),
    (
        LogitLensMonitor,
        {"thresholds": THRESHOLDS},
        {
            "accuracy",
            "loss",
            "saturation_counts",
            "saturation_cos",
            "early_exit",
            "kl_to_final",
            "entropy",
            "final_rank",
        },
    ),
    (NeuralCollapseMonitor, {}, {"nc1"}),
    (
        EffectiveDepthMonitor,
        {"epsilons": EPSILONS},
        {"effective_depth", "effective_depth_reached", "effective_depth_relative"},
    ),
]


PACKAGE_ANALYSES = ("similarity", "logit_lens", "neural_collapse", "depth", "trajectory")


def alone(*analyses, **options) -> LayerwiseAnalysis:
    """LayerwiseAnalysis running only ``analyses`` (the package's other analyses off)."""
    chosen = {analysis.name: analysis for analysis in analyses}
    return LayerwiseAnalysis(**{name: chosen.get(name, False) for name in PACKAGE_ANALYSES}, **options)


OWN = ("figure_functions", "analyses")  # each run names its own figure functions and analyses


@pytest.mark.parametrize("monitor, kwargs, keys", MONITORS, ids=[m[0].__name__ for m in MONITORS])
def test_each_analysis_alone_matches_the_full_analysis(tmp_path, analysis_run, monitor, kwargs, keys):
    full = analysis_run[0]
    callback = alone(monitor(**kwargs), log_figures=False)
    trainer(tmp_path, [callback]).validate(fitted_module(), val_loader(N), verbose=False)
    summary = read_summary(tmp_path)
    assert set(summary) == HEADER | keys
    assert list(summary["analyses"]) == [monitor.name]
    results = {key: value for key, value in summary.items() if key not in OWN}
    assert_json_close(results, {key: full[key] for key in results}, atol=1e-12)


def test_two_analysis_callbacks_merge_into_one_json(tmp_path, analysis_run):
    full = analysis_run[0]
    callbacks = [alone(LayerSimilarityMonitor(), log_figures=False), alone(NeuralCollapseMonitor(), log_figures=False)]
    trainer(tmp_path, callbacks).validate(fitted_module(), val_loader(N), verbose=False)
    summary = read_summary(tmp_path)
    assert set(summary) == HEADER | {"cos", "cka", "nc1", *COS_DISTRIBUTION}
    assert list(summary["analyses"]) == ["similarity", "neural_collapse"]  # each callback's record kept
    results = {key: value for key, value in summary.items() if key not in OWN}
    assert_json_close(results, {key: full[key] for key in results}, atol=1e-12)


def test_a_new_run_replaces_an_old_summary_instead_of_merging_and_keeps_it_aside(tmp_path):
    trainer(tmp_path, [alone(LogitLensMonitor(), log_figures=False)]).validate(
        fitted_module(), val_loader(N), verbose=False
    )
    earlier = read_summary(tmp_path)
    assert "accuracy" in earlier
    with pytest.warns(UserWarning, match=r"held the summary of an earlier run; moved it to val_epoch_000.*\.earlier-"):
        trainer(tmp_path, [alone(NeuralCollapseMonitor(), log_figures=False)]).validate(
            fitted_module(), val_loader(N), verbose=False
        )
    summary = read_summary(tmp_path)
    assert "nc1" in summary and "accuracy" not in summary  # no stale key from the earlier run
    kept = list(tmp_path.rglob("val_epoch_*.json.earlier-*"))
    assert len(kept) == 1 and json.loads(kept[0].read_text()) == earlier  # nothing of the earlier run is lost


def test_callbacks_with_different_layers_fail_before_any_work(tmp_path):
    callbacks = [alone(LayerSimilarityMonitor(), layers=[0, -1]), alone(NeuralCollapseMonitor())]
    with pytest.raises(ValueError, match="the same `layers`"):
        trainer(tmp_path, callbacks).validate(fitted_module(), val_loader(N), verbose=False)
    assert not list(tmp_path.rglob("*.json"))


def test_bf16_mixed_precision_features_give_float64_statistics(tmp_path):
    # bf16 autocast (CPU here; the same code path as bf16-mixed on a GPU): features arrive in bf16, the metrics
    # accumulate in float64 and agree with the fp32 run to bf16's resolution.
    fp32, bf16 = tmp_path / "fp32", tmp_path / "bf16"
    trainer(fp32, [LayerwiseAnalysis(log_figures=False)]).validate(fitted_module(), val_loader(N), verbose=False)
    trainer(bf16, [LayerwiseAnalysis(log_figures=False)], precision="bf16-mixed").validate(
        fitted_module(), val_loader(N), verbose=False
    )
    full, half = read_summary(fp32), read_summary(bf16)
    assert half["num_samples"] == N
    assert np.allclose(half["cos"], full["cos"], atol=0.05) and np.allclose(half["cka"], full["cka"], atol=0.05)
    assert np.abs(np.array(half["accuracy"]) - np.array(full["accuracy"])).max() <= 0.05
    assert all(np.isfinite(half["nc1"]))
