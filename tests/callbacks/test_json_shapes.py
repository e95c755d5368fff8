"""The same summary key has the same JSON shape whatever the model's depth (no size-1 result turned into a number)."""

import json
from typing import Any

import pytest
import torch
from helpers import CLASSES, digits, read_summary, trainer
from torch.utils.data import DataLoader, TensorDataset

from layerwise.callbacks import BlockCoupling, LayerwiseAnalysis, ResidualNormRatioMonitor
from layerwise.features import TimmViT
from layerwise.lightning_modules import Standard


def signature(value: Any) -> Any:
    """The JSON value with every number replaced by "n" and every list by the signature of its items."""
    if isinstance(value, dict):
        return {key: signature(item) for key, item in value.items()}
    if isinstance(value, list):
        inner = {repr(signature(item)) for item in value if item is not None}
        return ["list", sorted(inner)]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return "n"
    return type(value).__name__


def summary_at_depth(tmp_path, depth: int) -> dict[str, Any]:
    torch.manual_seed(0)
    backbone = TimmViT(
        num_classes=CLASSES, img_size=8, patch_size=2, in_chans=1, embed_dim=16, depth=depth, num_heads=2
    )
    assert backbone.num_layers == depth
    _, _, x, y = digits()
    loader = DataLoader(TensorDataset(x[:40], y[:40]), batch_size=20)
    callbacks = [
        LayerwiseAnalysis(log_figures=False),
        BlockCoupling(n_samples=2, ks=(2,), tokens="first", log_figures=False),
        ResidualNormRatioMonitor(log_figures=False),
    ]
    trainer(tmp_path / f"depth_{depth}", callbacks).validate(Standard(backbone), loader, verbose=False)
    return read_summary(tmp_path / f"depth_{depth}")


@pytest.mark.parametrize("shallow", [2, 3])
def test_every_key_keeps_its_shape_from_a_shallow_to_a_deep_model(tmp_path, shallow):
    deep, short = summary_at_depth(tmp_path, 6), summary_at_depth(tmp_path, shallow)
    assert deep["coupling"]["trajectory_step_ratio"] and len(deep["coupling"]["trajectory_step_ratio"]) == 5
    ratios = short["coupling"]["trajectory_step_ratio"]  # BlockCoupling measures from x^0: L steps, L - 1 ratios
    assert isinstance(ratios, list) and len(ratios) == shallow - 1
    if shallow == 3:  # the analysis's own trajectory (block outputs 1..L, so L - 1 steps and L - 2 ratios)
        assert isinstance(short["trajectory_step_ratio"], list) and len(short["trajectory_step_ratio"]) == 1
    shared = sorted(set(deep) & set(short) - {"run_id", "layers", "depth"})
    assert {"accuracy", "cos", "coupling"} <= set(shared) and any("residual" in key for key in shared)
    for key in shared:
        assert signature(short[key]) == signature(deep[key]), f"{key}: {short[key]!r} vs {deep[key]!r}"


@pytest.mark.parametrize("depth", [2, 4])
def test_what_the_callbacks_write_fits_the_schema_every_reader_reads(tmp_path, depth):
    """A summary of every kind of analysis, of a shallow and a deeper model, passes the readers' schema as it is."""
    from layerwise.results import check_summary, summary_order

    summary_at_depth(tmp_path, depth)  # read through load_summary: the schema
    files = sorted((tmp_path / f"depth_{depth}" / "layerwise").glob("val_epoch_*.json"), key=summary_order)
    written = json.loads(files[-1].read_text())
    assert {"coupling", "residual_norm_ratio", "cos_quantiles", "early_exit"} <= set(written)
    assert check_summary(written) == written
