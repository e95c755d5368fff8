"""Each training strategy's loss equals an independent re-computation of its formula."""

import lightning.pytorch as pl
import pytest
import torch
import torch.nn.functional as F
from helpers import TRAINING_ONLY, RecordingAlternating
from torch.utils.data import DataLoader, TensorDataset

from layerwise.features import TimmViT
from layerwise.lightning_modules import (
    Aligned,
    AlternatingAligned,
    CosRegularized,
    LayerwiseModule,
    MultiExit,
    Standard,
    resolve_layer_weights,
)
from layerwise.metrics import readout_from_logits

NUM_CLASSES, DEPTH = 5, 3


def tiny_backbone(**kwargs) -> TimmViT:
    torch.manual_seed(0)
    backbone = TimmViT(
        num_classes=NUM_CLASSES, img_size=8, patch_size=4, in_chans=1, embed_dim=16, depth=DEPTH, num_heads=2, **kwargs
    )
    assert backbone.num_layers == DEPTH and backbone.embed_dim == 16
    return backbone


def batch(n: int = 6):
    generator = torch.Generator().manual_seed(1)
    return torch.randn(n, 1, 8, 8, generator=generator), torch.randint(0, NUM_CLASSES, (n,), generator=generator)


def reference_layer_logits(backbone: TimmViT, x: torch.Tensor, head=None) -> list[torch.Tensor]:
    """Run timm's modules by hand, block by block, and apply a head (default: the model's own) to every CLS token."""
    model = backbone.model
    entering = {}
    handle = model.blocks[0].register_forward_pre_hook(lambda module, args: entering.setdefault("x", args[0]))
    try:
        model.forward_features(x)  # timm's own embedding, position embedding and pre-norm
    finally:
        handle.remove()
    tokens = entering["x"]
    logits = []
    for block in model.blocks:
        tokens = block(tokens)
        cls = tokens[:, 0].double()
        if head is None:
            norm = model.norm
            normed = F.layer_norm(cls, norm.normalized_shape, norm.weight.double(), norm.bias.double(), norm.eps)
            logits.append(normed @ model.head.weight.double().T + model.head.bias.double())
        else:
            logits.append(head(cls.float()).double())
    return logits


def ce(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return -logits.log_softmax(-1)[torch.arange(len(y)), y].mean()


def outputs_of(module, x, y):
    return module.samples((x, y))


def test_the_base_module_is_abstract():
    with pytest.raises(TypeError, match="compute_loss"):
        LayerwiseModule(tiny_backbone())


def test_shared_head_on_last_layer_is_the_models_own_output():
    backbone = tiny_backbone().eval()
    x, _ = batch()
    with torch.no_grad():
        assert torch.allclose(Standard(backbone)(x), backbone.model(x), atol=1e-6)


def test_standard_loss_is_last_layer_cross_entropy():
    module = Standard(tiny_backbone())
    x, y = batch()
    expected = ce(reference_layer_logits(module.backbone, x)[-1], y)
    assert torch.allclose(module.compute_loss(outputs_of(module, x, y)).double(), expected, atol=1e-5)
    assert module.num_classifiers == 1


@pytest.mark.parametrize("spec", ["linear", "uniform", [0.5, 1.0, 2.0]])
def test_aligned_loss_is_weighted_sum_over_layers(spec):
    module = Aligned(tiny_backbone(), layer_weights=spec)
    x, y = batch()
    if spec == "linear":
        weights = [2 * layer / (DEPTH * (DEPTH + 1)) for layer in range(1, DEPTH + 1)]
    elif spec == "uniform":
        weights = [1 / DEPTH] * DEPTH
    else:
        weights = spec
    expected = sum(w * ce(z, y) for w, z in zip(weights, reference_layer_logits(module.backbone, x)))
    assert torch.allclose(module.compute_loss(outputs_of(module, x, y)).double(), expected, atol=1e-5)


@pytest.mark.parametrize("layers", [1, 2, 6, 12, 24])
def test_linear_and_uniform_weights_sum_to_one(layers):
    linear = resolve_layer_weights("linear", layers)
    assert torch.isclose(linear.double().sum(), torch.tensor(1.0, dtype=torch.float64), atol=1e-6)
    assert torch.all(linear[1:] > linear[:-1])  # deeper layers weigh more
    assert torch.isclose(resolve_layer_weights("uniform", layers).sum(), torch.tensor(1.0), atol=1e-6)


def test_multi_exit_has_one_head_per_layer_and_its_loss():
    module = MultiExit(tiny_backbone(), distill_weight=0.5, distill_temperature=2.0)
    assert module.num_classifiers == DEPTH and len(module.exit_heads) == DEPTH - 1
    # the exit heads are separate parameters, not the shared head
    shared = {id(p) for p in module.backbone.model.head.parameters()}
    assert not shared & {id(p) for p in module.exit_heads.parameters()}
    with torch.no_grad():
        for head in module.exit_heads:
            head[-1].weight.normal_()
    x, y = batch()
    outputs = outputs_of(module, x, y)
    heads = [*module.exit_heads, None]
    own = reference_layer_logits(module.backbone, x)
    exit_logits = [
        reference_layer_logits(module.backbone, x, head)[i] if head is not None else own[i]
        for i, head in enumerate(heads)
    ]
    exits = module.layer_outputs((x, y)).exit_readout  # the separate heads through the one readout
    expected = readout_from_logits(torch.stack(exit_logits), y)
    assert torch.equal(exits.predictions, expected.predictions)
    assert torch.allclose(exits.max_prob, expected.max_prob, atol=1e-5)
    assert torch.allclose(exits.nll, expected.nll, atol=1e-5)
    weights = [2 * layer / (DEPTH * (DEPTH + 1)) for layer in range(1, DEPTH + 1)]
    supervised = sum(w * ce(z, y) for w, z in zip(weights, exit_logits))
    t = 2.0
    teacher = (exit_logits[-1] / t).softmax(-1)
    kl = [(teacher * (teacher.log() - (z / t).log_softmax(-1))).sum(-1).mean() for z in exit_logits[:-1]]
    expected = supervised + 0.5 * t**2 * sum(kl) / len(kl)
    assert torch.allclose(module.compute_loss(outputs).double(), expected, atol=1e-5)


@pytest.mark.parametrize("center", [True, False])
def test_cos_regularized_loss(center):
    module = CosRegularized(tiny_backbone(), beta=0.3, center=center)
    module.log = lambda *args, **kwargs: None  # no Trainer: the loss's parts have nowhere to be logged
    x, y = batch()
    outputs = outputs_of(module, x, y)
    features = outputs["features"].double()
    if center:
        features = features - features.mean(dim=1, keepdim=True)
    last = features[-1]
    cosines = []
    for layer in features[:-1]:
        for i in range(len(y)):
            cosines.append(layer[i] @ last[i] / (layer[i].norm() * last[i].norm()))
    expected = ce(reference_layer_logits(module.backbone, x)[-1], y) - 0.3 * torch.stack(cosines).mean()
    assert torch.allclose(module.compute_loss(outputs).double(), expected, atol=1e-5)


def fit_recording(alternate_by: str, accumulate: int, batches: int = 8) -> list[str]:
    module = RecordingAlternating(tiny_backbone(), alternate_by=alternate_by)
    x = torch.randn(batches * 2, 1, 8, 8)
    y = torch.randint(0, NUM_CLASSES, (batches * 2,))
    trainer = pl.Trainer(
        max_epochs=1,
        accumulate_grad_batches=accumulate,
        accelerator="cpu",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(module, DataLoader(TensorDataset(x, y), batch_size=2))
    assert trainer.global_step == batches // accumulate
    return module.objectives


@TRAINING_ONLY
def test_alternating_switches_on_optimizer_steps_under_gradient_accumulation():
    # Steps count from 1: step 1 (micro-batches 1-2) last-layer CE, step 2 (3-4) aligned, ...
    assert fit_recording("optimizer_step", accumulate=2) == ["last", "last", "aligned", "aligned"] * 2


@TRAINING_ONLY
def test_alternating_per_micro_batch_option():
    assert fit_recording("micro_batch", accumulate=2) == ["last", "aligned"] * 4


def test_alternating_losses_are_the_two_objectives():
    module = AlternatingAligned(tiny_backbone())
    x, y = batch()
    logits = reference_layer_logits(module.backbone, x)
    aligned = sum((2 * (i + 1) / (DEPTH * (DEPTH + 1))) * ce(z, y) for i, z in enumerate(logits))
    assert torch.allclose(module.aligned_loss(outputs_of(module, x, y)).double(), aligned, atol=1e-5)


def test_parameter_saving_is_reported(caplog):
    module = MultiExit(tiny_backbone())
    report = module.head_parameter_report()
    head = sum(p.numel() for p in module.backbone.model.norm.parameters()) + sum(
        p.numel() for p in module.backbone.model.head.parameters()
    )
    assert f"one shared head has {head:,} parameters" in report
    assert f"{DEPTH} separate exit heads would have {DEPTH * head:,}" in report
    assert f"saves {(DEPTH - 1) * head:,} parameters" in report
    # the exit heads really cost what the report says
    assert sum(p.numel() for p in module.exit_heads.parameters()) == (DEPTH - 1) * head


def test_mlp_backbone_layers_block_by_block_and_residual_switch():
    from layerwise.features import MLPBackbone

    torch.manual_seed(0)
    x = torch.randn(5, 1, 8, 8)
    for residual in (True, False):
        backbone = MLPBackbone(in_features=64, width=16, depth=3, num_classes=4, residual=residual).eval()
        features = backbone(x)
        assert features.shape == (3, 5, 16)
        hidden, context = backbone.embed(x)
        for index in range(3):
            previous = hidden
            hidden = backbone.run_block(index, hidden, context)
            torch.testing.assert_close(backbone.pool(hidden, context), features[index])
            block = backbone.blocks[index]
            update = block.act(block.linear(block.norm(previous)))
            torch.testing.assert_close(hidden, previous + update if residual else update)
        assert backbone.head(features).shape == (3, 5, 4)
        assert backbone.head_modules()(features[-1]).shape == (5, 4)
    with pytest.raises(ValueError, match="in_features=100"):
        MLPBackbone(in_features=64)(torch.randn(2, 100))
