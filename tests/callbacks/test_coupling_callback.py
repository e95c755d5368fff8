"""BlockCoupling: the summary equals a direct computation, it shares the summary, and 2 DDP processes equal 1."""

import json

import pytest
import torch
from helpers import assert_json_close, read_summary, trainer
from tiny_models import decoder, lm_loader

from layerwise.callbacks import BlockCoupling, LayerwiseAnalysis
from layerwise.features.jacobian import diagonal_jacobians, trace_blocks
from layerwise.features.paths import get_blocks, layer_paths
from layerwise.figures.summary import summary_figures
from layerwise.lightning_modules import Standard
from layerwise.metrics.functional_dynamics import coupling_score, depth_coupling, line_shape_score

KS = (2, 5)


def direct(backbone, n_samples: int) -> dict:
    """Mean depth-wise matrices over the first prompts, from the layer-access functions called by hand."""
    model = backbone.model
    blocks = get_blocks(model, layer_paths(model))
    rows = list(lm_loader().dataset)[:n_samples]
    matrices, lss = [], []
    for row in rows:
        trace = trace_blocks(blocks, lambda row=row: model(input_ids=row["input_ids"][None], use_cache=False))
        matrices.append(depth_coupling(diagonal_jacobians(blocks, trace, -1), KS))
        lss.append(line_shape_score(trace.trajectory))
    matrices = torch.stack(matrices).mean(0)
    return {"matrices": matrices, "score": coupling_score(matrices), "lss": torch.cat(lss).mean()}


def test_block_coupling_summary_equals_direct_computation_and_shares_the_file(tmp_path):
    backbone = decoder("gpt2")
    module = Standard(backbone).double()
    callbacks = [LayerwiseAnalysis(log_figures=False, token_stride=2), BlockCoupling(n_samples=3, ks=KS)]
    trainer(tmp_path, callbacks).validate(module, lm_loader(), verbose=False)
    summary = read_summary(tmp_path)
    assert "cos" in summary and summary["layers"] == [1, 2, 3]  # the analysis' keys are kept
    coupling = summary["coupling"]
    expected = direct(backbone, 3)
    assert coupling["num_prompts"] == 3 and coupling["ks"] == list(KS)
    torch.testing.assert_close(torch.tensor(coupling["depth_coupling"], dtype=torch.float64), expected["matrices"])
    torch.testing.assert_close(torch.tensor(coupling["coupling_score"], dtype=torch.float64), expected["score"])
    assert coupling["trajectory_lss"] == pytest.approx(expected["lss"].item(), rel=1e-9)
    assert coupling["trajectory_lss"] >= 1.0 and len(coupling["sigma"]) == 3
    assert -1.0 <= coupling["linearisation_cosine"] <= 1.0
    figures = summary_figures(summary)
    assert {"coupling_depth", "coupling_spectra", "coupling_trajectory", "cos"} <= set(figures)


def test_block_coupling_refuses_bad_options():
    with pytest.raises(ValueError, match="n_samples"):
        BlockCoupling(n_samples=0)
    with pytest.raises(ValueError, match="ks"):
        BlockCoupling(ks=())
    module = Standard(decoder("gpt2")).double()
    callback = BlockCoupling(ks=(64,))  # wider than d = 32
    with pytest.raises(ValueError, match="at most the model width"):
        trainer("/tmp/unused", [callback]).validate(module, lm_loader(), verbose=False)


def test_block_coupling_on_two_processes_equals_one(tmp_path, single_thread):
    torch.save(decoder("gpt2").state_dict(), tmp_path / "weights.pt")

    def analyse(root, **options):
        model = decoder("gpt2")
        model.load_state_dict(torch.load(tmp_path / "weights.pt"))
        callback = BlockCoupling(n_samples=5, ks=KS, log_figures=False)
        trainer(root, [callback], **options).validate(Standard(model).double(), lm_loader(), verbose=False)
        return json.loads(next((root / "layerwise").glob("val_epoch_*.json")).read_text())

    one = analyse(tmp_path / "one")
    many = analyse(tmp_path / "many", devices=2, strategy="ddp_fork")
    assert one["coupling"]["num_prompts"] == many["coupling"]["num_prompts"] == 5
    assert_json_close(many, one, atol=1e-12, rtol=1e-9)


def test_block_coupling_on_a_vit_at_the_cls_token(tmp_path):
    from helpers import fitted_module, val_loader

    callback = BlockCoupling(n_samples=4, ks=(2, 4), tokens="first", log_figures=False)
    trainer(tmp_path, [callback]).validate(fitted_module(), val_loader(16), verbose=False)
    coupling = read_summary(tmp_path)["coupling"]
    assert coupling["num_prompts"] == 4 and coupling["token"] == "first"
    assert all(-1.5 < score < 0 for score in coupling["coupling_score"])
    assert coupling["trajectory_lss"] >= 1.0
