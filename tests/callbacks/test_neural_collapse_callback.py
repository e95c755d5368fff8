"""NeuralCollapseMonitor(complete=True, ncc=True) end to end on the tiny ViT: every JSON key against a float64 numpy
reference from the saved features and the head's own final norm and classifier rows, its scalars and charts."""

import numpy as np
import pytest
import torch
from helpers import DEPTH, assert_json_close, fitted_module, read_features, read_summary, trainer, val_loader

from layerwise.analyses.neural_collapse import HEAD, NCC, STREAMED
from layerwise.callbacks import LayerwiseAnalysis, NeuralCollapseMonitor
from layerwise.engines.readout import split_head

N = 101  # 6 batches of 16 and a ragged one of 5


def nc_alone(collapse: NeuralCollapseMonitor, **runner) -> LayerwiseAnalysis:
    """Neural collapse alone in the one callback that runs analyses (its options; the runner's given here)."""
    return LayerwiseAnalysis(
        similarity=False, logit_lens=False, depth=False, trajectory=False, neural_collapse=collapse, **runner
    )


def layer_norm64(h: np.ndarray, norm: torch.nn.LayerNorm) -> np.ndarray:
    """LayerNorm in float64 with the module's own parameters, written out."""
    mean = h.mean(axis=-1, keepdims=True)
    var = ((h - mean) ** 2).mean(axis=-1, keepdims=True)
    weight, bias = (p.detach().double().numpy() for p in (norm.weight, norm.bias))
    return (h - mean) / np.sqrt(var + norm.eps) * weight + bias


def reference(h: np.ndarray, y: np.ndarray, pred: np.ndarray, hin: np.ndarray, w: np.ndarray) -> dict[str, float]:
    """One layer's measures from their definitions (classes present; mu_G the mean of the class means)."""
    classes = np.unique(y)
    k = len(classes)
    mu = np.stack([h[y == c].mean(axis=0) for c in classes])
    sigma2 = np.array([((h[y == c] - mu[i]) ** 2).sum(axis=1).mean() for i, c in enumerate(classes)])
    cdnv = [(sigma2[a] + sigma2[b]) / (2 * ((mu[a] - mu[b]) ** 2).sum()) for a in range(k) for b in range(k) if a != b]
    m = mu - mu.mean(axis=0)
    norms = np.linalg.norm(m, axis=1)
    cos = np.array([m[a] @ m[b] / (norms[a] * norms[b]) for a in range(k) for b in range(a + 1, k)])
    etf = (np.eye(k) - 1.0 / k) / np.sqrt(k - 1)
    gram = m @ m.T
    head_mu = np.stack([hin[y == c].mean(axis=0) for c in classes])
    hm = head_mu - head_mu.mean(axis=0)
    rows = w[classes]
    unit = lambda v: v / np.linalg.norm(v, axis=-1, keepdims=True)  # noqa: E731
    dual = rows @ hm.T
    nearest = classes[np.argmin(((h[:, None, :] - mu[None]) ** 2).sum(axis=-1), axis=1)]
    return {
        "cdnv": np.mean(cdnv),
        "nc2_equinorm": np.std(norms, ddof=1) / np.mean(norms),
        "nc2_cos_std": np.std(cos),
        "nc2_equiangular": np.mean(np.abs(cos + 1 / (k - 1))),
        "nc2_etf": np.linalg.norm(gram / np.linalg.norm(gram) - etf),
        "nc3": np.linalg.norm(unit(rows) - unit(hm), axis=1).mean(),
        "nc3_duality": np.linalg.norm(dual / np.linalg.norm(dual) - etf),
        "nc4_agreement": np.mean(nearest == pred),
        "nc4_ncc_accuracy": np.mean(nearest == y),
    }


@pytest.fixture(scope="module")
def nc_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("nc")
    monitor = nc_alone(NeuralCollapseMonitor(complete=True, ncc=True), save_features=True, log_figures=False)
    trainer(root, [monitor]).validate(fitted_module(), val_loader(N), verbose=False)
    return root, monitor


def test_every_key_equals_the_float64_reference(nc_run):
    root, _ = nc_run
    summary, saved = read_summary(root), read_features(root)
    backbone = fitted_module().backbone
    h = saved["features"].double().numpy()
    labels, predictions = saved["labels"].numpy(), saved["predictions"].numpy()
    head = split_head(backbone.head_modules())  # the timm ViT's head: final norm, fc_norm (identity), drop, Linear
    assert head is not None and head.weight.shape == (10, h.shape[-1])
    norms = [step for step in head.steps if isinstance(step, torch.nn.LayerNorm)]
    assert len(norms) == 1
    head_inputs = layer_norm64(h, norms[0])
    w = head.weight.numpy()
    rows = [reference(h[layer], labels, predictions[layer], head_inputs[layer], w) for layer in range(DEPTH)]
    expected = {key: [row[key] for row in rows] for key in (*STREAMED, *HEAD, *NCC)}
    for key in NCC:  # neither trivial: some samples agree, some do not
        assert 0.0 < min(expected[key]) and max(expected[key]) < 1.0, key
    for key, values in expected.items():
        assert_json_close(summary[key], [float(v) for v in values], rtol=1e-9, where=key)
    assert {"nc1", *STREAMED, *HEAD, *NCC} <= set(summary)


def test_scalars_and_charts_name_every_key(nc_run):
    root, monitor = nc_run
    summary = read_summary(root)
    scalars = monitor.scalars(summary)
    for key in ("nc1", *STREAMED, *HEAD, *NCC):
        assert {f"{key}/layer_{layer:02d}" for layer in range(1, DEPTH + 1)} <= set(scalars), key
        assert any(regex == rf"{key}/layer_\d+" for regex in monitor.charts().values()), key
    assert len(monitor.charts()) == 1 + len(STREAMED) + len(HEAD) + len(NCC)


def test_composed_analysis_gives_the_same_values_and_nc1_is_unchanged(tmp_path, nc_run):
    root, _ = nc_run
    alone = read_summary(root)
    composed = LayerwiseAnalysis(
        log_figures=False, similarity=False, trajectory=False, neural_collapse=NeuralCollapseMonitor(complete=True)
    )
    trainer(tmp_path / "composed", [composed]).validate(fitted_module(), val_loader(N), verbose=False)
    summary = read_summary(tmp_path / "composed")
    assert not set(NCC) & set(summary)  # NC4 only with ncc=True
    for key in ("nc1", *STREAMED, *HEAD):
        assert_json_close(summary[key], alone[key], rtol=1e-12, where=key)
    trainer(tmp_path / "nc1", [nc_alone(NeuralCollapseMonitor(), log_figures=False)]).validate(
        fitted_module(), val_loader(N), verbose=False
    )
    only = read_summary(tmp_path / "nc1")
    assert only["nc1"] == alone["nc1"] and not ({*STREAMED, *HEAD} & set(only))  # the default: NC1, bit for bit


def test_options_are_refused_in_one_line():
    with pytest.raises(ValueError, match=r"NeuralCollapseMonitor\(ncc=True\): .* `complete=True`"):
        NeuralCollapseMonitor(ncc=True)
    with pytest.raises(ValueError, match=r"NeuralCollapseMonitor\(ncc_max_samples=0\): give a positive int"):
        NeuralCollapseMonitor(complete=True, ncc=True, ncc_max_samples=0)


def test_a_hooked_model_gives_the_same_values(tmp_path, nc_run):
    """The hook source (a user's own model) splits the head found by the path table, as the module's own head."""
    root, _ = nc_run
    expected = read_summary(root)
    monitor = nc_alone(NeuralCollapseMonitor(complete=True, ncc=True), source="hooks", log_figures=False)
    trainer(tmp_path, [monitor]).validate(fitted_module(), val_loader(N), verbose=False)
    summary = read_summary(tmp_path)
    for key in ("nc1", *STREAMED, *HEAD, *NCC):
        assert_json_close(summary[key], expected[key], rtol=1e-6, atol=1e-9, where=key)


def test_a_language_model_restricted_to_its_top_classes(tmp_path):
    """GPT-2 (tiny), ``top_classes=6``: the rows of the frequent tokens only, NC3 against their rows of the LM head
    after ln_f, NC4 against the head's predictions (a token outside the six never agrees) — equal to the functional
    on the module's own layer outputs."""
    from lightning.pytorch import LightningDataModule
    from tiny_models import LM_VOCAB, decoder, lm_loader

    from layerwise.lightning_modules import Standard
    from layerwise.metrics import neural_collapse_measures

    module = Standard(decoder("gpt2"), chunk_size=5).double()
    parts = [module.layer_outputs(batch) for batch in lm_loader()]
    targets = torch.cat([part.targets for part in parts])

    class Text(LightningDataModule):
        def val_dataloader(self):
            return lm_loader()

        def class_counts(self):  # the frequencies of the validation tokens themselves (the test's choice)
            return torch.bincount(targets, minlength=LM_VOCAB)

    monitor = nc_alone(NeuralCollapseMonitor(top_classes=6, complete=True, ncc=True), log_figures=False)
    trainer(tmp_path, [monitor]).validate(module, datamodule=Text(), verbose=False)
    summary = read_summary(tmp_path)
    classes = torch.tensor(summary["nc1_classes"])
    assert classes.numel() == 6
    assert all(value is not None for key in ("nc3", "nc4_agreement") for value in summary[key])

    features = torch.cat([part.features for part in parts], 1)
    predictions = torch.cat([part.readout.predictions for part in parts], 1)
    mapping = torch.full((LM_VOCAB,), -1, dtype=torch.long)
    mapping[classes] = torch.arange(6)
    keep = mapping[targets] >= 0
    head = split_head(module.backbone.head_modules())
    assert head is not None
    with torch.no_grad():
        head_inputs = head.steps(features[:, keep].double())
    expected = neural_collapse_measures(
        features[:, keep],
        mapping[targets[keep]],
        6,
        mapping[predictions[:, keep]],
        head_inputs,
        head.weight[classes],
    )
    for key, value in expected.items():
        assert_json_close(summary[key], value.tolist(), rtol=1e-9, atol=1e-12, where=key)


def test_the_head_is_read_afresh_at_every_validation_of_a_fit(tmp_path):
    """Two epochs of training: the second validation's NC3 is that of the trained head, not of the first one's."""
    from helpers import train_loader

    module = fitted_module()
    fit = trainer(tmp_path / "fit", [nc_alone(NeuralCollapseMonitor(complete=True), log_figures=False)], max_epochs=2)
    fit.fit(module, train_loader(), val_loader(N))
    during = [read_summary(tmp_path / "fit", epoch=epoch) for epoch in (0, 1)]
    trainer(tmp_path / "after", [nc_alone(NeuralCollapseMonitor(complete=True), log_figures=False)]).validate(
        module, val_loader(N), verbose=False
    )
    after = read_summary(tmp_path / "after")
    assert during[0]["nc3"] != during[1]["nc3"]  # the head trained between the two
    for key in HEAD:
        assert_json_close(during[1][key], after[key], rtol=1e-9, atol=1e-12, where=key)


def test_one_selected_layer_gives_one_element_lists(tmp_path, nc_run):
    root, _ = nc_run
    full = read_summary(root)
    monitor = nc_alone(NeuralCollapseMonitor(complete=True, ncc=True), layers=[-1], log_figures=False)
    trainer(tmp_path, [monitor]).validate(fitted_module(), val_loader(N), verbose=False)
    summary = read_summary(tmp_path)
    for key in ("nc1", *STREAMED, *HEAD, *NCC):
        assert isinstance(summary[key], list) and len(summary[key]) == 1, key
        assert_json_close(summary[key][0], full[key][-1], rtol=1e-9, atol=1e-12, where=key)
