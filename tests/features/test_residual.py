"""Residual norm ratio ||x|| / ||F(x)||: the hooks against a manual computation from the sub-block outputs of tiny
models of each family, the metric against numpy, and the callback's JSON against the same reference."""

import numpy as np
import pytest
import timm
import torch
from helpers import fitted_module, read_summary, trainer, val_loader
from tiny_models import tiny_config
from transformers import AutoModel
from transformers.utils import logging as hf_logging

from layerwise.callbacks import ResidualNormRatioMonitor
from layerwise.features.branches import BranchNorms, default_token, token_positions
from layerwise.features.hooks import block_output
from layerwise.features.paths import find_layer_paths, get_blocks
from layerwise.metrics.residual import ResidualNormRatio

hf_logging.set_verbosity_error()
DEPTH, WIDTH, VOCAB = 3, 32, 96
# family -> (how its blocks are built, names of the attention and MLP modules inside a block)
FAMILIES = {
    "timm_vit": ("sequential", "attn", "mlp"),
    "bert": ("post_ln", "attention.output.dense", "output.dense"),
    "gpt2": ("sequential", "attn", "mlp"),
    "gpt_neox": ("parallel", "attention", "mlp"),
    "llama": ("sequential", "self_attn", "mlp"),
}


def tiny(family: str) -> torch.nn.Module:
    torch.manual_seed(0)
    if family == "timm_vit":
        return timm.create_model(
            "vit_tiny_patch16_224", img_size=16, patch_size=4, embed_dim=WIDTH, depth=DEPTH, num_heads=4, num_classes=3
        ).double()
    config = tiny_config(family, vocab_size=VOCAB, pad_token_id=0)  # DEPTH blocks of width WIDTH, as here
    assert (config.num_hidden_layers, config.hidden_size) == (DEPTH, WIDTH)
    return AutoModel.from_config(config).double().eval()


def inputs(family: str) -> dict:
    g = torch.Generator().manual_seed(1)
    if family == "timm_vit":
        return {"x": torch.randn(4, 3, 16, 16, generator=g, dtype=torch.float64)}
    ids = torch.randint(3, VOCAB, (4, 7), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0  # right padding: the last real token of sample 1 is position 4
    mask[2, 3:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def manual_norms(model, family: str, batch: dict, token) -> tuple[np.ndarray, np.ndarray]:
    """(skip, branch) norms (3, L, B) of block / attention / MLP from full sub-block outputs and the block algebra."""
    kind, attention_name, mlp_name = FAMILIES[family]
    blocks = model.blocks if family == "timm_vit" else get_blocks(model, find_layer_paths(model))
    seen: dict = {}
    handles = []
    for i, block in enumerate(blocks):
        handles.append(
            block.register_forward_pre_hook(
                lambda m, args, kwargs, i=i: seen.__setitem__(
                    ("in", i), (args[0] if args else kwargs["hidden_states"])
                ),
                with_kwargs=True,
            )
        )
        handles.append(
            block.register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(("out", i), block_output(out)))
        )
        for key, name in (("attn", attention_name), ("mlp", mlp_name)):
            module = block.get_submodule(name)
            handles.append(
                module.register_forward_hook(lambda m, a, out, i=i, k=key: seen.__setitem__((k, i), block_output(out)))
            )
        if kind == "post_ln":
            attention = block.get_submodule("attention")
            handles.append(
                attention.register_forward_hook(lambda m, a, out, i=i: seen.__setitem__(("mid", i), block_output(out)))
            )
    with torch.no_grad():
        model(batch["x"]) if family == "timm_vit" else model(**batch)
    for handle in handles:
        handle.remove()
    rows = torch.arange(4)
    skip, branch = np.zeros((3, DEPTH, 4)), np.zeros((3, DEPTH, 4))
    norm = lambda v: torch.linalg.vector_norm(v, dim=-1).numpy()  # noqa: E731
    for i in range(DEPTH):
        x, y, a, m = (seen[(k, i)][rows, token].double() for k in ("in", "out", "attn", "mlp"))
        skip[0, i], branch[0, i] = norm(x), norm(y - x)
        if kind == "sequential":  # x -> h = x + a -> h + m
            torch.testing.assert_close(x + a + m, y, rtol=0, atol=1e-10)
            skip[1:, i], branch[1:, i] = [norm(x), norm(x + a)], [norm(a), norm(m)]
        elif kind == "parallel":  # x + a + m, both branches read x
            torch.testing.assert_close(x + a + m, y, rtol=0, atol=1e-10)
            skip[1:, i], branch[1:, i] = [norm(x), norm(x)], [norm(a), norm(m)]
        else:  # post-LN: mid = LN(x + a), y = LN(mid + m); the ratio before each LayerNorm
            mid = seen[("mid", i)][rows, token].double()
            ln = blocks[i].attention.output.LayerNorm
            torch.testing.assert_close(ln(x + a), mid, rtol=0, atol=1e-10)
            skip[1:, i], branch[1:, i] = [norm(x), norm(mid)], [norm(a), norm(m)]
    return skip, branch


@pytest.mark.parametrize("family", list(FAMILIES))
def test_branch_norms_equal_a_manual_computation_from_the_sub_blocks(family):
    model = tiny(family).eval()
    batch = inputs(family)
    paths = find_layer_paths(model)
    token = token_positions(batch.get("attention_mask"), default_token(paths))
    if family in ("gpt2", "gpt_neox", "llama"):
        assert token.tolist() == [6, 4, 2, 6]
    else:
        assert token == 0
    norms = BranchNorms(get_blocks(model, paths), paths.branches)
    with norms.attached():
        norms.token = token
        with torch.no_grad():
            model(batch["x"]) if family == "timm_vit" else model(**batch)
    skip, branch = norms.pop()
    assert norms.names == ("block", "attention", "mlp")
    expected_skip, expected_branch = manual_norms(model, family, batch, token)
    np.testing.assert_allclose(skip.numpy(), expected_skip, rtol=1e-12)
    np.testing.assert_allclose(branch.numpy(), expected_branch, rtol=1e-12)
    assert not any(block._forward_pre_hooks or block._forward_hooks for block in get_blocks(model, paths))


def test_token_positions_left_and_right_padding():
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 1, 1], [1, 0, 0, 0]])
    assert token_positions(mask, "last").tolist() == [2, 3, 0]
    assert token_positions(None, "last") == -1 and token_positions(mask, "cls") == 0


def test_a_family_without_branches_is_refused_with_the_table_named():
    with pytest.raises(ValueError, match="gives no residual branches.*paths.py"):
        BranchNorms([torch.nn.Linear(2, 2)], {})


def test_norm_ratio_metric_matches_numpy_mean_and_log_quantiles():
    g = torch.Generator().manual_seed(3)
    skip = torch.rand(2, 3, 500, generator=g, dtype=torch.float64) * 50 + 0.1
    branch = torch.rand(2, 3, 500, generator=g, dtype=torch.float64) * 5 + 0.01
    branch[0, 0, :7] = 0.0  # no branch: left out
    levels = (0.0, 0.05, 0.5, 0.95, 1.0)
    metric = ResidualNormRatio(2, 3, levels)
    for part_skip, part_branch in zip(skip.split((100, 1, 249, 150), -1), branch.split((100, 1, 249, 150), -1)):
        metric.update(part_skip, part_branch)
    mean, quantiles, count, below, above = metric.compute()
    assert below.sum() == above.sum() == 0
    ratio = (skip / branch).numpy()
    valid = np.isfinite(ratio)
    assert count[0, 0] == 493 and count[1, 2] == 500
    for p in range(2):
        for layer in range(3):
            r = ratio[p, layer][valid[p, layer]]
            assert mean[p, layer].item() == pytest.approx(r.mean(), rel=1e-12)
            log_exact = np.quantile(np.log10(r), levels)
            assert np.abs(np.log10(quantiles[p, layer].numpy()) - log_exact).max() <= 0.005 + 1e-12


def test_monitor_json_equals_the_reference_on_the_tiny_vit(tmp_path):
    module = fitted_module()
    loader = val_loader(40, batch_size=16)
    trainer(tmp_path, [ResidualNormRatioMonitor(log_figures=False)]).validate(module, loader, verbose=False)
    result = read_summary(tmp_path)["residual_norm_ratio"]
    assert result["branches"] == ["block", "attention", "mlp"] and result["token"] == "cls"
    assert result["layers"] == list(range(1, module.backbone.num_layers + 1)) and result["num_samples"] == 40
    vit = module.backbone.model.double()
    skip, branch = [], []
    for x, _ in loader:
        s, b = manual_norms_any_depth(vit, x.double())
        skip.append(s), branch.append(b)
    ratio = np.concatenate(skip, -1) / np.concatenate(branch, -1)
    np.testing.assert_allclose(result["mean"], ratio.mean(-1), rtol=1e-5)  # float32 run vs float64 reference
    median = np.quantile(np.log10(ratio), 0.5, axis=-1)
    assert np.abs(np.log10(np.array(result["quantiles"])[..., 2]) - median).max() <= 0.005 + 1e-4
    assert np.array(result["mean"])[0, -1] > 1.0


def manual_norms_any_depth(vit, x):
    """Block/attention/MLP norms of a timm ViT at the [CLS] token, by running each block's parts by hand."""
    first = []
    handle = vit.blocks[0].register_forward_pre_hook(lambda module, args: first.append(args[0]))
    with torch.no_grad():
        vit(x)
    handle.remove()
    h = first[0]
    skip, branch = [], []
    with torch.no_grad():
        for block in vit.blocks:
            a = block.ls1(block.attn(block.norm1(h)))
            mid = h + a
            m = block.ls2(block.mlp(block.norm2(mid)))
            out = mid + m
            cls = [v[:, 0] for v in (h, a, mid, m, out)]
            n = [torch.linalg.vector_norm(v, dim=-1).numpy() for v in cls]
            skip.append([n[0], n[0], n[2]])
            branch.append([torch.linalg.vector_norm(cls[4] - cls[0], dim=-1).numpy(), n[1], n[3]])
            h = out
    return np.array(skip).transpose(1, 0, 2), np.array(branch).transpose(1, 0, 2)


def test_layerscale_ratios_above_1e4_are_measured_not_saturated(tmp_path):
    """CaiT/DeiT-III LayerScale (1e-5) gives ratios near 1e5: quantiles within 0.005 decades of numpy's on the exact
    ratios, nothing outside the range, the mean exact."""
    module = fitted_module()
    vit = timm.create_model(
        "vit_tiny_patch16_224",
        img_size=8,
        patch_size=2,
        in_chans=1,
        embed_dim=16,
        depth=4,
        num_heads=2,
        num_classes=10,
        init_values=1e-5,
    )
    module.backbone.model = vit.eval()
    loader = val_loader(40, batch_size=16)
    # float64: in float32 the block's F(x) = block(x) - x loses ~3 digits to cancellation when F(x) ~ 1e-5 ||x||
    fit = trainer(tmp_path, [ResidualNormRatioMonitor(log_figures=False)], precision="64-true")
    fit.validate(module, loader, verbose=False)
    result = read_summary(tmp_path)["residual_norm_ratio"]
    skip, branch = zip(*(manual_norms_any_depth(vit.double(), x.double()) for x, _ in loader))
    ratio = np.concatenate(skip, -1) / np.concatenate(branch, -1)
    assert np.median(ratio[1:]) > 1e4  # the attention and MLP branches: far above the old 1e4 ceiling
    log_exact = np.quantile(np.log10(ratio), result["quantile_levels"], axis=-1).transpose(1, 2, 0)
    np.testing.assert_allclose(
        np.log10(np.array(result["quantiles"], dtype=float)), log_exact, rtol=0, atol=0.005 + 1e-9
    )
    np.testing.assert_allclose(result["mean"], ratio.mean(-1), rtol=1e-9)
    assert result["log10_range"] == [-10.0, 10.0]
    assert np.array(result["below_range"]).sum() == np.array(result["above_range"]).sum() == 0


def test_ratios_outside_the_histogram_are_counted_and_their_quantiles_null():
    g = torch.Generator().manual_seed(4)
    skip = 10.0 ** (torch.rand(1, 2, 300, generator=g, dtype=torch.float64) * 8 - 2)  # ratios 1e-2 .. 1e6
    branch = torch.ones_like(skip)
    levels = (0.05, 0.5, 0.95)
    metric = ResidualNormRatio(1, 2, levels, bins=400, low=-1.0, high=3.0)
    metric.update(skip, branch)
    result = metric.compute()
    log_ratio = torch.log10(skip).numpy()
    below, above = (log_ratio < -1).sum(-1), (log_ratio > 3).sum(-1)
    assert below.min() > 15 and above.min() > 15  # both tails hold more than 5 % of the ratios
    np.testing.assert_array_equal(result.below.numpy(), below), np.testing.assert_array_equal(result.above, above)
    exact = np.quantile(log_ratio, levels, axis=-1).transpose(1, 2, 0)  # (1, 2, Q)
    outside = (exact < -1) | (exact > 3)
    estimate = np.log10(result.quantiles.numpy())
    assert outside.any() and np.isnan(estimate[outside]).all()  # absent, never the edge of the range
    assert np.abs(estimate[~outside] - exact[~outside]).max() <= 0.005 + 1e-12
