"""Early exit that saves compute: block-by-block execution, the per-sample definition, skipped blocks, the writer.

References are independent of the implementation: every sample runs alone through the full model (``forward``,
all layers), its per-layer logits go through the rule in a plain Python loop, and the batched, block-by-block
result must give exactly the same predictions and exit layers. The models run in float64 there, so the batched and
the single-sample logits agree to ~1e-15 and no confidence can straddle a threshold by rounding; thresholds are
chosen half-way between two observed values.
"""

import csv
import json
import math
from pathlib import Path

import pytest
import torch
from helpers import digits, fitted_backbone, fitted_module, trainer, val_loader
from tiny_models import tiny_overrides
from torch import nn

from layerwise.callbacks import EarlyExitPredictionWriter
from layerwise.cli import LayerwiseCLI
from layerwise.engines.early_exit import check_criterion, early_exit_predict, measure_speedup
from layerwise.features import Backbone, HFEncoder, TimmViT
from layerwise.metrics.functional import _early_exit_compute, _early_exit_update

QUICKSTART = str(Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml")
VOCAB, LENGTH, CLASSES = 50, 9, 3
BERT_SIZES = dict(hidden_size=16, num_attention_heads=2, intermediate_size=32, max_position_embeddings=512)
HF_SIZES = {  # with the Hugging Face default of 512 positions, which this test was written with
    "bert": tiny_overrides("bert", num_hidden_layers=4, **BERT_SIZES),
    "roberta": tiny_overrides("roberta", num_hidden_layers=3, **BERT_SIZES),
    "distilbert": tiny_overrides(
        "distilbert", n_layers=3, dim=16, n_heads=2, hidden_dim=32, max_position_embeddings=512
    ),
}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: these models are tiny, and on a loaded 2-core box two threads are ~30x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def hf_encoder(model_type: str, attention: str = "sdpa", seed: int = 0) -> HFEncoder:
    """A tiny random encoder (float64, eval) whose predictions and confidences vary between samples and layers.

    BERT's default init (std 0.02) barely changes the [CLS] feature from block to block, so every layer would
    predict the same; std 0.2 and a classifier scaled by 5 spread the confidences over 0.37-0.99 instead.
    """
    torch.manual_seed(seed)
    overrides = {
        **HF_SIZES[model_type],
        "vocab_size": VOCAB,
        "attn_implementation": attention,
        "initializer_range": 0.2,
    }
    backbone = HFEncoder(model_type=model_type, config_overrides=overrides, num_classes=CLASSES).double().eval()
    assert backbone.model.config._attn_implementation == attention
    assert (backbone.num_layers, backbone.embed_dim) == (HF_SIZES[model_type].get("num_hidden_layers", 3), 16)
    with torch.no_grad():
        for module in backbone.head_steps.modules()[-1:]:
            module.weight.mul_(5.0)
    return backbone


def padded_tokens(num_samples: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random token ids with right padding of varying length (every row keeps at least 2 tokens)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (num_samples, LENGTH), generator=generator)
    lengths = torch.randint(2, LENGTH + 1, (num_samples,), generator=generator)
    lengths[0] = LENGTH
    mask = (torch.arange(LENGTH).view(1, -1) < lengths.view(-1, 1)).long()
    assert (mask == 0).any() and (mask == 1).all(dim=0).any()
    return {"input_ids": ids * mask, "attention_mask": mask}


def tiny_vit(pooling: str) -> TimmViT:
    torch.manual_seed(0)
    backbone = TimmViT(
        num_classes=5, img_size=8, patch_size=2, in_chans=1, embed_dim=16, depth=3, num_heads=2, pooling=pooling
    )
    return backbone.double().eval()


def block_by_block(backbone: Backbone, inputs, keep_after_first=None) -> torch.Tensor:
    """Every layer's pooled feature via embed/run_block/pool; optionally keep only some rows after block 1."""
    hidden, context = backbone.embed(inputs)
    features = []
    for index in range(backbone.num_layers):
        hidden = backbone.run_block(index, hidden, context)
        if index == 0 and keep_after_first is not None:
            hidden, context = hidden[keep_after_first], backbone.select(context, keep_after_first)
        features.append(backbone.pool(hidden, context))
    return torch.stack(features)


def take_rows(inputs, rows):
    return {key: value[rows] for key, value in inputs.items()} if isinstance(inputs, dict) else inputs[rows]


# -- block-by-block execution equals forward --------------------------------------------------------------------


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_timm_blocks_equal_forward(pooling):
    backbone = tiny_vit(pooling)
    x = torch.randn(5, 1, 8, 8, dtype=torch.float64)
    with torch.no_grad():
        expected = backbone(x)
        torch.testing.assert_close(block_by_block(backbone, x), expected, rtol=0, atol=1e-6)
        rows = torch.tensor([3, 0])
        torch.testing.assert_close(block_by_block(backbone, x, rows), expected[:, rows], rtol=0, atol=1e-6)


@pytest.mark.parametrize("attention", ["eager", "sdpa"])
@pytest.mark.parametrize("model_type", ["bert", "roberta", "distilbert"])
def test_hf_blocks_equal_forward_with_padding(model_type, attention):
    backbone = hf_encoder(model_type, attention)
    inputs = padded_tokens(6)
    with torch.no_grad():
        expected = backbone(inputs)
        _, context = backbone.embed(inputs)
        masks = [value for value in context.args if isinstance(value, torch.Tensor)]
        assert masks and masks[0].shape[0] == 6  # the padding mask reaches the blocks, one per sample
        torch.testing.assert_close(block_by_block(backbone, inputs), expected, rtol=0, atol=1e-6)
        rows = torch.tensor([4, 1, 5])  # padded rows selected after block 1 keep their own masks
        torch.testing.assert_close(block_by_block(backbone, inputs, rows), expected[:, rows], rtol=0, atol=1e-6)
    assert not backbone.blocks[0]._forward_pre_hooks  # embed's stop hook is gone


class NoBlocks(Backbone):
    num_layers, embed_dim, num_classes = 1, 2, 2

    def forward(self, inputs):
        return inputs.unsqueeze(0)

    def head(self, h):
        return h

    def head_modules(self):
        return nn.Identity()


def test_backbone_without_blocks_names_the_class():
    with pytest.raises(NotImplementedError, match="NoBlocks does not implement `embed`"):
        early_exit_predict(NoBlocks(), torch.zeros(2, 2), threshold=0.5)


# -- batched early exit equals the per-sample definition -----------------------------------------------------------


def per_sample_logits(backbone: Backbone, inputs, num_samples: int) -> torch.Tensor:
    """``(N, L, C)``: each sample alone through the full model, the shared head on every layer."""
    with torch.no_grad():
        return torch.stack([backbone.head(backbone(take_rows(inputs, [i])))[:, 0] for i in range(num_samples)])


def reference_exit(layer_logits: torch.Tensor, name: str, value) -> tuple[int, int]:
    """(prediction, 1-based exit layer) of one sample by the definition, one layer at a time."""
    previous, unchanged = None, 0
    for layer, logits in enumerate(layer_logits, start=1):
        probabilities = torch.softmax(logits.double(), dim=-1)
        prediction = int(torch.argmax(logits))
        if name == "threshold":
            done = probabilities.max().item() >= value
        elif name == "entropy":
            done = torch.special.entr(probabilities).sum().item() <= value
        else:
            unchanged = unchanged + 1 if prediction == previous else 0
            previous = prediction
            done = unchanged >= value
        if done or layer == len(layer_logits):
            return prediction, layer
    raise AssertionError("unreachable")


def half_way(values: torch.Tensor, fraction: float) -> float:
    """A value half-way between two neighbouring distinct observed values, near the ``fraction`` quantile."""
    unique = torch.unique(values.flatten())
    k = min(int(fraction * len(unique)), len(unique) - 2)
    return float((unique[k] + unique[k + 1]) / 2)


def criterion_for(name: str, regime: str, logits: torch.Tensor):
    """The criterion value making everyone exit at layer 1, nobody exit early, or a mix (from the observed logits)."""
    probabilities = torch.softmax(logits[:, :-1].double(), dim=-1)
    num_layers = logits.shape[1]
    if name == "threshold":
        return {"first": 0.0, "last": 1.0, "mixed": half_way(probabilities.max(dim=-1).values, 0.6)}[regime]
    if name == "entropy":
        entropy = torch.special.entr(probabilities).sum(dim=-1)
        return {"first": 10.0, "last": 0.0, "mixed": half_way(entropy, 0.3)}[regime]
    return {"first": 0, "last": num_layers - 1, "mixed": 1}[regime]


@pytest.fixture(scope="module")
def vit_case():
    _, _, images, _ = digits()
    backbone = fitted_backbone().double()
    inputs = images[:40].double()
    return backbone, inputs, per_sample_logits(backbone, inputs, 40)


@pytest.fixture(scope="module")
def bert_case():
    backbone = hf_encoder("bert")
    inputs = padded_tokens(24, seed=1)
    return backbone, inputs, per_sample_logits(backbone, inputs, 24)


@pytest.mark.parametrize("regime", ["mixed", "first", "last"])
@pytest.mark.parametrize("name", ["threshold", "entropy", "patience"])
@pytest.mark.parametrize("case", ["vit_case", "bert_case"])
def test_batched_equals_per_sample_definition(case, name, regime, request):
    backbone, inputs, logits = request.getfixturevalue(case)
    value = criterion_for(name, regime, logits)
    reference = [reference_exit(sample, name, value) for sample in logits]
    expected_predictions = torch.tensor([prediction for prediction, _ in reference])
    expected_layers = torch.tensor([layer for _, layer in reference])
    num_layers = backbone.num_layers
    if regime == "first":
        assert (expected_layers == 1).all()
    elif regime == "last":
        assert (expected_layers == num_layers).all()
    else:  # a genuine mix: some exit early, some at the last layer
        assert (expected_layers < num_layers).any() and len(torch.unique(expected_layers)) >= 2

    result = early_exit_predict(backbone, inputs, **{name: value})
    assert torch.equal(result.exit_layers, expected_layers)
    assert torch.equal(result.predictions, expected_predictions)
    counts = torch.bincount(expected_layers - 1, minlength=num_layers).double()
    layers = torch.arange(1, num_layers + 1, dtype=torch.float64)
    assert result.layer_count_speedup == pytest.approx(float(num_layers * counts.sum() / (layers * counts).sum()))
    assert torch.equal(result.exit_counts, counts.long())


def test_threshold_exits_match_the_analysis_metric(vit_case):
    # the logit-lens callback's early exit (one full pass, every layer) sees the same exits and speedup
    backbone, inputs, _ = vit_case
    with torch.no_grad():
        layer_logits = backbone.head(backbone(inputs))
    thresholds = torch.tensor([0.3, 0.6, 0.9])
    targets = layer_logits[-1].argmax(-1)
    _, exit_counts, count = _early_exit_update(layer_logits, targets, thresholds, backbone.num_layers)
    layers = torch.arange(1, backbone.num_layers + 1)
    _, _, speedup = _early_exit_compute(torch.zeros(3), exit_counts, count, layers, backbone.num_layers)
    for i, tau in enumerate(thresholds.tolist()):
        result = early_exit_predict(backbone, inputs, threshold=tau)
        assert torch.equal(result.exit_counts.double(), exit_counts[i])
        assert result.layer_count_speedup == pytest.approx(speedup[i].item(), rel=1e-12)


# -- exited samples cost nothing afterwards ----------------------------------------------------------------------


def rows_per_block(backbone: Backbone, run) -> tuple[list[int], object]:
    seen = [0] * backbone.num_layers
    blocks = backbone.blocks if isinstance(backbone, HFEncoder) else backbone.model.blocks

    def counter(index):
        def hook(module, args, kwargs):
            hidden = args[0] if args else kwargs["hidden_states"]
            seen[index] += hidden.shape[0]

        return hook

    handles = [block.register_forward_pre_hook(counter(i), with_kwargs=True) for i, block in enumerate(blocks)]
    try:
        value = run()
    finally:
        for handle in handles:
            handle.remove()
    return seen, value


@pytest.mark.parametrize("case", ["vit_case", "bert_case"])
def test_exited_samples_never_reach_later_blocks(case, request):
    backbone, inputs, logits = request.getfixturevalue(case)
    for criterion in ({"threshold": criterion_for("threshold", "mixed", logits)}, {"patience": 1}):
        seen, result = rows_per_block(backbone, lambda c=criterion: early_exit_predict(backbone, inputs, **c))
        expected = [int((result.exit_layers >= layer).sum()) for layer in range(1, backbone.num_layers + 1)]
        assert seen == expected and expected[0] > expected[-1] > 0


def test_measure_speedup_times_the_same_exits(vit_case):
    backbone, inputs, logits = vit_case
    tau = criterion_for("threshold", "mixed", logits)
    batches = [inputs[:16], inputs[16:]]
    result = measure_speedup(backbone, batches, threshold=tau, repeats=2, warmup=0)
    direct = early_exit_predict(backbone, inputs, threshold=tau)
    assert torch.equal(result.exit_layers, direct.exit_layers) and torch.equal(result.predictions, direct.predictions)
    assert result.full_seconds > 0 and result.early_exit_seconds > 0
    assert result.measured_speedup == pytest.approx(result.full_seconds / result.early_exit_seconds)
    assert result.layer_count_speedup == pytest.approx(direct.layer_count_speedup)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, r"exactly one .*`threshold` or `entropy` or `patience` \(got none\)"),
        ({"threshold": 0.5, "patience": 2}, r"got threshold=0.5, patience=2"),
        ({"threshold": 1.5}, r"`threshold=1.5` must be a probability"),
        ({"entropy": -0.1}, r"`entropy=-0.1` must be a finite entropy"),
        ({"patience": -1}, r"`patience=-1` must be an integer"),
        ({"patience": 1.5}, r"`patience=1.5` must be an integer"),
    ],
)
def test_criterion_errors_name_the_option(kwargs, message):
    with pytest.raises(ValueError, match=message):
        check_criterion(**kwargs)


def test_writer_errors_name_the_flag():
    with pytest.raises(ValueError, match=r"`--trainer.callbacks.threshold=2` must be a probability"):
        EarlyExitPredictionWriter(threshold=2)
    with pytest.raises(ValueError, match=r"`--trainer.callbacks.threshold` or"):
        EarlyExitPredictionWriter()


# -- the prediction writer ---------------------------------------------------------------------------------------


def test_writer_predicts_with_early_exit_and_writes_csv_and_json(tmp_path):
    module, loader = fitted_module(), val_loader(37, batch_size=8)
    tau = 0.6
    writer = EarlyExitPredictionWriter(threshold=tau, output_path=str(tmp_path / "exits.csv"))
    seen, _ = rows_per_block(module.backbone, lambda: trainer(tmp_path, [writer]).predict(module, loader))
    assert module.early_exit is None  # reset: a later predict runs the full model again

    expected = [early_exit_predict(module.backbone, x, threshold=tau) for x, _ in loader]
    exit_layers = torch.cat([result.exit_layers for result in expected])
    predictions = torch.cat([result.predictions for result in expected])
    targets = loader.dataset.tensors[1]
    assert seen == [int((exit_layers >= layer).sum()) for layer in range(1, module.num_layers + 1)]
    assert 0 < int((exit_layers < module.num_layers).sum()) < 37

    with open(tmp_path / "exits.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert list(rows[0]) == ["index", "prediction", "exit_layer", "target"]
    assert [int(row["index"]) for row in rows] == list(range(37))
    assert [int(row["prediction"]) for row in rows] == predictions.tolist()
    assert [int(row["exit_layer"]) for row in rows] == exit_layers.tolist()
    assert [int(row["target"]) for row in rows] == targets.tolist()
    summary = json.loads((tmp_path / "exits.summary.json").read_text())
    assert summary["criterion"] == {"threshold": tau} and summary["num_samples"] == 37
    assert summary["accuracy"] == pytest.approx((predictions == targets).double().mean().item())
    assert summary["exit_counts"] == torch.bincount(exit_layers - 1, minlength=module.num_layers).tolist()
    assert summary["layer_count_speedup"] == pytest.approx(module.num_layers * 37 / exit_layers.sum().item())
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]

    # JSON, unlabelled data: no target, no accuracy; the plain predict still returns every layer afterwards
    images = torch.utils.data.DataLoader(loader.dataset.tensors[0][:10], batch_size=4)
    writer = EarlyExitPredictionWriter(patience=1, output_path=str(tmp_path / "exits.json"))
    trainer(tmp_path, [writer]).predict(module, images)
    records = json.loads((tmp_path / "exits.json").read_text())
    assert [record["index"] for record in records] == list(range(10))
    assert all(record["target"] is None for record in records)
    assert json.loads((tmp_path / "exits.summary.json").read_text())["accuracy"] is None
    plain = trainer(tmp_path, []).predict(module, images)
    assert plain[0].readout.predictions.shape == (module.num_layers, 4)


def test_writer_under_ddp_writes_every_sample_once_in_index_order(tmp_path, single_thread):
    # 2 gloo processes, 37 samples: the ranks hold 19 and 18 rows; rank zero writes the same file as one process
    module, loader = fitted_module(), val_loader(37, batch_size=8)
    for name, options in (("one", {}), ("two", {"devices": 2, "strategy": "ddp_fork"})):
        writer = EarlyExitPredictionWriter(threshold=0.6, output_path=str(tmp_path / f"{name}.csv"))
        trainer(tmp_path / name, [writer], **options).predict(module, loader, return_predictions=False)
    assert (tmp_path / "two.csv").read_text() == (tmp_path / "one.csv").read_text()
    one, two = (json.loads((tmp_path / f"{n}.summary.json").read_text()) for n in ("one", "two"))
    assert one == two and one["num_samples"] == 37


# the checkpoint is saved without a fit, so its ModelCheckpoint state has no folder yet; predict restores it and
# Lightning notes the folder "changed from None"
@pytest.mark.filterwarnings("ignore:The dirpath has changed from None to")
def test_cli_predict_with_the_writer_on_the_quickstart_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tiny = [
        "--config",
        QUICKSTART,
        "--model.init_args.backbone.init_args.embed_dim=16",
        "--model.init_args.backbone.init_args.depth=2",
        "--model.init_args.backbone.init_args.num_heads=2",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.logger.init_args.save_dir={tmp_path}",
    ]
    # an untrained checkpoint in the CLI's own format (hyper-parameters = the parsed config); a fit costs seconds
    built = LayerwiseCLI(args=tiny, run=False)
    built.trainer.strategy.connect(built.model)
    checkpoint = tmp_path / "tiny.ckpt"
    built.trainer.save_checkpoint(checkpoint)
    cli = LayerwiseCLI(
        args=[
            "predict",
            *tiny,
            f"--ckpt_path={checkpoint}",
            "--trainer.callbacks+=layerwise.callbacks.EarlyExitPredictionWriter",
            "--trainer.callbacks.threshold=0.2",
            "--trainer.callbacks.output_path=exits.csv",
        ]
    )
    writers = [c for c in cli.trainer.callbacks if isinstance(c, EarlyExitPredictionWriter)]
    assert len(writers) == 1 and writers[0].criterion == {"threshold": 0.2}
    assert any(type(c).__name__ == "LayerwiseAnalysis" for c in cli.trainer.callbacks)  # appended, not replaced
    with open(tmp_path / "exits.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    assert len(rows) == 360 and [int(row["index"]) for row in rows] == list(range(360))
    summary = json.loads((tmp_path / "exits.summary.json").read_text())
    assert summary["num_layers"] == 2 and sum(summary["exit_counts"]) == 360
    assert math.isfinite(summary["layer_count_speedup"]) and summary["accuracy"] is not None


@pytest.mark.parametrize("rows", [16, 0])
def test_a_sharded_backbone_runs_every_block_whatever_its_samples_exit(monkeypatch, rows):
    """FSDP2 gathers a block's weights in a collective at every call: a rank whose samples all exited at block 1
    (or that has none) still calls every block, on no rows, with the same predictions as without sharding."""
    from layerwise.engines import early_exit

    backbone = fitted_backbone()
    inputs = digits()[2][:rows]
    alone = early_exit_predict(backbone, inputs, threshold=0.0)  # everyone exits at layer 1
    monkeypatch.setattr(early_exit, "is_sharded", lambda module: True)
    calls = [0] * backbone.num_layers

    def counting(index):
        def hook(module, args):
            calls[index] += 1

        return hook

    handles = [block.register_forward_pre_hook(counting(i)) for i, block in enumerate(backbone.model.blocks)]
    try:
        locked = early_exit_predict(backbone, inputs, threshold=0.0)
    finally:
        for handle in handles:
            handle.remove()
    assert calls == [1] * backbone.num_layers
    assert torch.equal(locked.predictions, alone.predictions) and torch.equal(locked.exit_layers, alone.exit_layers)
