"""Language models end to end: HF encoders and causal LMs as backbones, the five strategies, sampled exits, analysis.

Every model is a tiny real Hugging Face architecture built offline from its config (sizes asserted in the fixtures).
References are computed independently, in float64, from Hugging Face's own outputs (``output_hidden_states`` and
``logits``), never from layerwise's code paths.
"""

import itertools

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_json_close, read_summary, trainer
from lightning.pytorch import LightningDataModule
from sklearn.metrics import f1_score
from tiny_models import DECODERS, ENCODERS, LM_LAYERS, LM_VOCAB, LM_WIDTH, decoder, encoder, lm_loader, tiny_overrides
from torch.utils.data import DataLoader

from layerwise.callbacks import LayerwiseAnalysis, NeuralCollapseMonitor, _loader
from layerwise.engines.readout import chunked_readout
from layerwise.features import HFCausalLM, HFEncoder
from layerwise.lightning_modules import Aligned, AlternatingAligned, CosRegularized, MultiExit, Standard
from layerwise.lightning_modules.weights import resolve_layer_weights, sample_exit_layers
from layerwise.metrics import LayerF1, readout_from_logits

LAYERS, WIDTH, VOCAB = LM_LAYERS, LM_WIDTH, LM_VOCAB


def text_batch(batch_size: int = 3, length: int = 11, seed: int = 0, labels: bool = False) -> dict:
    """Token ids with right padding in row 1 (its last 4 positions) — padding must predict nothing."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(2, VOCAB, (batch_size, length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, -4:] = 0
    batch = {"input_ids": input_ids, "attention_mask": attention_mask}
    if labels:
        batch["labels"] = torch.arange(batch_size) % 2
    return batch


def next_token_targets(batch: dict) -> torch.Tensor:
    """(B, T-1) next tokens, -100 where the predicted token or the predicting token is padding (independent code)."""
    targets = batch["input_ids"][:, 1:].clone()
    mask = batch["attention_mask"]
    targets[(mask[:, 1:] == 0) | (mask[:, :-1] == 0)] = -100
    return targets


def reference_lm_logits(backbone: HFCausalLM, batch: dict) -> list[torch.Tensor]:
    """Per-layer logits (B, T, V) from HF's hidden states: norm + LM head for l < L, the model's own logits at L."""
    model = backbone.model
    with torch.no_grad():
        out = model(**batch, output_hidden_states=True)
    norm, lm_head = backbone.head_steps.modules()
    hidden = out.hidden_states  # embeddings, blocks 1..L-1 (pre-norm), block L with the final norm applied
    return [lm_head(norm(hidden[layer])) for layer in range(1, LAYERS)] + [out.logits]


def reference_encoder_logits(backbone: HFEncoder, batch: dict) -> list[torch.Tensor]:
    """Per-layer logits (B, C): the [CLS] state of every layer through the model's pooler + classifier."""
    model = backbone.model
    with torch.no_grad():
        out = model(**{k: v for k, v in batch.items() if k != "labels"}, output_hidden_states=True)
        cls = [h[:, 0] for h in out.hidden_states[1:]]
        if model.config.model_type == "bert":
            logits = [model.classifier(model.bert.pooler.activation(model.bert.pooler.dense(h))) for h in cls]
        elif model.config.model_type == "distilbert":
            logits = [model.classifier(torch.relu(model.pre_classifier(h))) for h in cls]
        else:  # RobertaClassificationHead reads token 0 of a sequence
            logits = [model.classifier(h.unsqueeze(1)) for h in cls]
    torch.testing.assert_close(logits[-1], out.logits, rtol=0, atol=1e-12)
    return logits


# ------------------------------------------------------------------------------------------- heads and the final norm
@pytest.mark.parametrize("model_type", sorted(ENCODERS))
def test_encoder_last_layer_logits_equal_model_logits(model_type):
    backbone = encoder(model_type)
    batch = text_batch(labels=True)
    module = Standard(backbone).double()
    outputs = module.layer_outputs(batch)
    own = backbone.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    torch.testing.assert_close(backbone.head(outputs.features[-1]), own, rtol=0, atol=1e-12)
    reference = torch.stack(reference_encoder_logits(backbone, batch))
    torch.testing.assert_close(backbone.head(outputs.features), reference, rtol=0, atol=1e-12)
    expected = readout_from_logits(reference, outputs.targets)  # what the one readout read at every layer
    assert torch.equal(outputs.readout.predictions, expected.predictions)
    torch.testing.assert_close(outputs.readout.max_prob, expected.max_prob, rtol=0, atol=1e-12)
    torch.testing.assert_close(outputs.readout.nll, expected.nll, rtol=0, atol=1e-12)


@pytest.mark.parametrize("model_type", sorted(DECODERS))
def test_final_norm_is_applied_exactly_once_at_every_layer(model_type):
    backbone = decoder(model_type)
    batch = text_batch()
    features = backbone(batch)  # (L, B, T, d), the residual stream after every block
    with torch.no_grad():
        hidden = backbone.model(**batch, output_hidden_states=True).hidden_states
    norm = backbone.head_steps.modules()[0]
    # HF's last hidden state already carries the final norm; the blocks' outputs do not.
    for layer in range(1, LAYERS):
        torch.testing.assert_close(features[layer - 1], hidden[layer], rtol=0, atol=1e-12)
    torch.testing.assert_close(norm(features[-1]), hidden[-1], rtol=0, atol=1e-12)
    assert (norm(hidden[-1]) - hidden[-1]).abs().max() > 1e-3  # normalising twice would show

    # The head normalises every layer's every token exactly once: the norm sees L x N rows in total.
    rows_normed = []
    handle = norm.register_forward_hook(lambda module, args, output: rows_normed.append(args[0].shape[0]))
    flat = features.flatten(1, 2)
    try:
        readout = chunked_readout(backbone.head, flat, None, chunk_size=7)
    finally:
        handle.remove()
    assert sum(rows_normed) == LAYERS * flat.shape[1]

    # And the per-layer predictions are HF's: hidden states through norm + head below L, the own logits at L.
    reference = torch.stack(reference_lm_logits(backbone, batch)).flatten(1, 2)
    assert torch.equal(readout.predictions, reference.argmax(-1))
    torch.testing.assert_close(readout.max_prob, reference.softmax(-1).amax(-1), rtol=0, atol=1e-12)


@pytest.mark.parametrize("model_type", sorted(DECODERS))
def test_lm_forward_equals_model_logits(model_type):
    backbone = decoder(model_type)
    batch = text_batch()
    module = Standard(backbone).double()
    with torch.no_grad():
        torch.testing.assert_close(module(batch), backbone.model(**batch).logits, rtol=0, atol=1e-12)


# --------------------------------------------------------------------------------------------------- the losses
def reference_lm_losses(backbone: HFCausalLM, batch: dict) -> torch.Tensor:
    targets = next_token_targets(batch)
    logits = reference_lm_logits(backbone, batch)
    return torch.stack(
        [F.cross_entropy(layer[:, :-1].reshape(-1, VOCAB), targets.flatten(), ignore_index=-100) for layer in logits]
    )


@pytest.mark.parametrize("model_type", sorted(DECODERS))
@pytest.mark.parametrize("chunk_size", [5, 4096])
def test_aligned_lm_loss_equals_independent_computation(model_type, chunk_size):
    backbone = decoder(model_type)
    batch = text_batch()
    module = Aligned(backbone, chunk_size=chunk_size).double()
    loss = module.compute_loss(module.samples(batch))
    weights = resolve_layer_weights("linear", LAYERS).double()
    expected = (weights * reference_lm_losses(backbone, batch)).sum()
    torch.testing.assert_close(loss, expected, rtol=1e-10, atol=0)
    loss.backward()
    assert all(p.grad is not None for p in backbone.parameters() if p.requires_grad)


@pytest.mark.parametrize("model_type", sorted(ENCODERS))
def test_aligned_encoder_loss_equals_independent_computation(model_type):
    backbone = encoder(model_type)
    batch = text_batch(labels=True)
    module = Aligned(backbone).double()
    loss = module.compute_loss(module.samples(batch))
    weights = resolve_layer_weights("linear", LAYERS).double()
    per_layer = torch.stack([F.cross_entropy(z, batch["labels"]) for z in reference_encoder_logits(backbone, batch)])
    torch.testing.assert_close(loss, (weights * per_layer).sum(), rtol=1e-10, atol=0)


def test_every_strategy_trains_a_language_model():
    batch = text_batch()
    reference = reference_lm_losses(decoder("gpt2"), batch)
    weights = resolve_layer_weights("linear", LAYERS).double()
    expected = {
        Standard: reference[-1],
        AlternatingAligned: reference[-1],  # step 1 is a last-layer step
        MultiExit: (weights * reference).sum(),  # exit heads start as copies of the shared head
    }
    for strategy, value in expected.items():
        module = strategy(decoder("gpt2"), chunk_size=6).double()
        if strategy is AlternatingAligned:
            module.step_number = lambda: 1
            module._log_window_means = lambda *args: None  # no Trainer: no logging window, nowhere to log
        loss = module.compute_loss(module.samples(batch))
        torch.testing.assert_close(loss, value, rtol=1e-10, atol=0, msg=strategy.__name__)

    module = CosRegularized(decoder("gpt2"), beta=0.5).double()
    module.log = lambda *args, **kwargs: None  # no Trainer: the loss's parts have nowhere to be logged
    outputs = module.samples(batch)
    keep = next_token_targets(batch).flatten() != -100
    features = module.backbone(batch)[:, :, :-1].flatten(1, 2)[:, keep]
    centred = features - features.mean(1, keepdim=True)
    cos = F.cosine_similarity(centred[:-1], centred[-1:], dim=-1).mean()
    torch.testing.assert_close(module.compute_loss(outputs), reference[-1] - 0.5 * cos, rtol=1e-10, atol=0)


def test_multi_exit_lm_has_one_head_per_layer_and_distils_in_chunks():
    module = MultiExit(decoder("gpt2"), distill_weight=1.0, chunk_size=4).double()
    assert module.num_classifiers == LAYERS and len(module.exit_heads) == LAYERS - 1
    with torch.no_grad():
        module.exit_heads[0][-1].weight.mul_(1.5)  # make exit 1 differ from the teacher
    batch = text_batch()
    logits = reference_lm_logits(module.backbone, batch)
    norm_copy, head_copy = list(module.exit_heads[0])
    with torch.no_grad():
        hidden = module.backbone.model(**batch, output_hidden_states=True).hidden_states
    student = head_copy(norm_copy(hidden[1]))
    keep = next_token_targets(batch).flatten() != -100
    flat = [z[:, :-1].reshape(-1, VOCAB)[keep] for z in (student, logits[1], logits[-1])]
    kl = [
        F.kl_div(F.log_softmax(z, -1), F.log_softmax(flat[2], -1), log_target=True, reduction="batchmean")
        for z in flat[:2]
    ]
    torch.testing.assert_close(module.distillation(module.samples(batch)), torch.stack(kl).mean(), rtol=1e-10, atol=0)


# ------------------------------------------------------------------------------------------------- sampled exits
@pytest.mark.parametrize("k", [1, 2, 3])
def test_sampled_exits_expected_loss_equals_aligned_loss_by_enumeration(k):
    layers = 5
    config = {**DECODERS["gpt2"], "n_layer": layers}
    torch.manual_seed(0)
    backbone = HFCausalLM(model_type="gpt2", config_overrides=config).double().eval()
    module = Aligned(backbone, sampled_exits=k, chunk_size=8).double()
    outputs = module.samples(text_batch())
    with torch.no_grad():
        aligned = module.weighted_loss(outputs)
        subsets = list(itertools.combinations(range(layers - 1), k))  # uniform sampling: every k-subset alike
        uniform = torch.stack([module.weighted_loss(outputs, list(s)) for s in subsets]).mean()
        module.exit_sampling = "rotating"  # rotation: the L-1 consecutive steps of one cycle alike
        rotating = torch.stack([module.weighted_loss(outputs, module.exit_layers(step)) for step in range(layers - 1)])
    torch.testing.assert_close(uniform, aligned, rtol=1e-12, atol=0)
    torch.testing.assert_close(rotating.mean(), aligned, rtol=1e-12, atol=0)
    picks = [layer for step in range(layers - 1) for layer in module.exit_layers(step)]
    assert sorted(picks) == sorted(list(range(layers - 1)) * k)  # every shallow layer k times per cycle


def test_uniform_sampled_exits_depend_only_on_step_and_seed():
    draws = [sample_exit_layers(12, 2, "uniform", step, seed=3) for step in range(200)]
    assert draws == [sample_exit_layers(12, 2, "uniform", step, seed=3) for step in range(200)]
    assert all(len(set(d)) == 2 and all(0 <= x < 11 for x in d) for d in draws)
    many = [sample_exit_layers(12, 2, "uniform", step, seed=3) for step in range(3000)]
    frequency = torch.bincount(torch.tensor(many).flatten(), minlength=11).double() / 3000
    assert (frequency - 2 / 11).abs().max() < 0.035  # binomial std 0.007: 5 sigma
    assert draws != [sample_exit_layers(12, 2, "uniform", step, seed=4) for step in range(200)]


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(sampled_exits=0), "sampled_exits"),
        (dict(sampled_exits=LAYERS - 1), "sampled_exits"),
        (dict(sampled_exits=1, exit_sampling="random"), "exit_sampling"),
        (dict(chunk_size=0), "chunk_size"),
    ],
)
def test_bad_sampled_exit_options_name_the_flag(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Aligned(decoder("gpt2"), **kwargs)


# -------------------------------------------------------------------------------------------- analysis over tokens
def lm_reference(backbone: HFCausalLM, loader: DataLoader) -> dict:
    """Per-layer accuracy, loss, perplexity over every predicted token, in float64, from HF's outputs."""
    logits, targets = [], []
    for batch in loader:
        layer_logits = reference_lm_logits(backbone, batch)
        logits.append(torch.stack([z[:, :-1].reshape(-1, VOCAB) for z in layer_logits], dim=0))
        targets.append(next_token_targets(batch).flatten())
    logits, targets = torch.cat(logits, 1), torch.cat(targets)
    loss = torch.stack([F.cross_entropy(z, targets) for z in logits])
    accuracy = (logits.argmax(-1) == targets).double().mean(1)
    return {"accuracy": accuracy, "loss": loss, "perplexity": loss.exp(), "num_samples": targets.numel()}


@pytest.mark.parametrize("group_batches", [1, 2, _loader.GROUP_BATCHES])
def test_lm_analysis_equals_reference_and_skips_vocabulary_nc1(tmp_path, monkeypatch, group_batches):
    # the three batches are fed in groups (of one, of two and one, all three): each equals the reference
    monkeypatch.setattr(_loader, "GROUP_BATCHES", group_batches)
    backbone = decoder("gpt2")
    module = Standard(backbone, chunk_size=5).double()
    callback = LayerwiseAnalysis(log_figures=False, token_stride=2)
    trainer(tmp_path, [callback]).validate(module, lm_loader(), verbose=False)
    summary = read_summary(tmp_path)
    reference = lm_reference(backbone, lm_loader())
    assert summary["num_samples"] == reference["num_samples"] == 7 * 8
    for key in ("accuracy", "loss", "perplexity"):
        torch.testing.assert_close(torch.tensor(summary[key], dtype=torch.float64), reference[key], rtol=1e-9, atol=0)
    assert "nc1" not in summary  # off by default when the classes are a vocabulary
    assert sum(summary["saturation_counts"]) == 7 * 8
    # COS over the subsample t % 2 == 0 only: recompute it from the features of those positions
    features = torch.cat([backbone(b)[:, :, :-1:2].flatten(1, 2) for b in lm_loader()], 1).detach()
    centred = features - features.mean(1, keepdim=True)
    unit = F.normalize(centred, dim=-1)
    cos = torch.einsum("lnd,mnd->lm", unit, unit) / unit.shape[1]
    torch.testing.assert_close(torch.tensor(summary["cos"], dtype=torch.float64), cos, rtol=0, atol=1e-9)


def test_nc1_is_left_out_of_a_language_models_analysis_without_top_classes(tmp_path):
    module = Standard(decoder("gpt2")).double()
    callback = LayerwiseAnalysis(neural_collapse=NeuralCollapseMonitor(), log_figures=False)
    trainer(tmp_path, [callback]).validate(module, lm_loader(), verbose=False)
    summary = read_summary(tmp_path)
    assert "nc1" not in summary and "accuracy" in summary  # over a whole vocabulary NC1 needs L x V x d statistics


# ----------------------------------------------------------------------------------------------------- GLUE F1
def test_layer_f1_equals_scikit_learn():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 57, 2, generator=generator)
    targets = torch.randint(0, 2, (57,), generator=generator)
    metric = LayerF1(4)
    for part in torch.arange(57).split(10):
        metric.update(logits[:, part], targets[part])
    expected = [f1_score(targets.numpy(), z.argmax(-1).numpy()) for z in logits]
    torch.testing.assert_close(metric.compute(), torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-12)
    empty = LayerF1(1)
    empty.update(torch.tensor([[[1.0, 0.0]]]), torch.tensor([0]))
    assert empty.compute().item() == 0.0  # neither predicted nor present: 0, as scikit-learn's zero_division


def encoder_loader(num_samples: int = 13, batch_size: int = 4) -> DataLoader:
    generator = torch.Generator().manual_seed(2)
    rows = []
    for index in range(num_samples):
        length = 5 + index % 4
        ids = torch.full((8,), 0)
        ids[:length] = torch.randint(2, VOCAB, (length,), generator=generator)
        mask = (torch.arange(8) < length).long()
        rows.append({"input_ids": ids, "attention_mask": mask, "labels": torch.tensor(index % 2)})
    return DataLoader(rows, batch_size=batch_size)


class BinaryData(LightningDataModule):
    """A datamodule with the attributes of a GLUE task that asks for F1 (MRPC, QQP)."""

    num_classes = 2
    metrics = ("accuracy", "f1")

    def val_dataloader(self) -> DataLoader:
        return encoder_loader()


@pytest.mark.parametrize("model_type", ["bert", "distilbert"])
def test_glue_style_per_layer_f1_and_accuracy_equal_independent_computation(tmp_path, model_type):
    backbone = encoder(model_type)
    module = Aligned(backbone).double()
    run = trainer(tmp_path, [LayerwiseAnalysis(log_figures=False)])
    run.validate(module, datamodule=BinaryData(), verbose=False)  # the datamodule asks for F1, as GLUE's does
    summary = read_summary(tmp_path)
    logits = [torch.stack(reference_encoder_logits(backbone, b)) for b in encoder_loader()]
    logits, labels = torch.cat(logits, 1), torch.cat([b["labels"] for b in encoder_loader()])
    predictions = logits.argmax(-1)
    expected_f1 = [f1_score(labels.numpy(), p.numpy()) for p in predictions]
    expected_acc = (predictions == labels).double().mean(1).tolist()
    assert_json_close(summary["f1"], expected_f1, atol=1e-12)
    assert_json_close(summary["accuracy"], expected_acc, atol=1e-12)


# -------------------------------------------------------------------------------------------------------- DDP


class RecordingSampled(Aligned):
    """Aligned with sampled exits that writes, per rank, the layers each training step used."""

    def __init__(self, *args, record_dir=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.record_dir, self.used = record_dir, []

    def layer_losses(self, outputs, layers):
        self.used.append(list(layers))
        return super().layer_losses(outputs, layers)

    def on_train_end(self):
        torch.save(self.used, f"{self.record_dir}/rank{self.global_rank}.pt")


def test_sampled_exits_pick_the_same_layers_on_every_rank(tmp_path, single_thread):
    torch.manual_seed(0)
    backbone = HFCausalLM(model_type="gpt2", config_overrides={**DECODERS["gpt2"], "n_layer": 6})
    module = RecordingSampled(backbone, sampled_exits=2, record_dir=tmp_path)
    loader = lm_loader(num_sequences=12, batch_size=2)
    run = trainer(tmp_path, [], devices=2, strategy="ddp_fork", max_steps=4, limit_val_batches=0)
    run.fit(module, loader)
    ranks = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(2)]
    assert len(ranks[0]) == 4 and ranks[0] == ranks[1]
    assert len({tuple(step) for step in ranks[0]}) > 1  # the draw changes from step to step
    assert all(step[-1] == 5 and len(step) == 3 for step in ranks[0])  # the last layer plus two sampled ones


def test_lm_analysis_on_two_processes_equals_one(tmp_path, single_thread):
    backbone = decoder("gpt2")
    torch.save(backbone.state_dict(), tmp_path / "weights.pt")

    def analyse(root, **options):
        model = decoder("gpt2")
        model.load_state_dict(torch.load(tmp_path / "weights.pt"))
        callback = LayerwiseAnalysis(log_figures=False, token_stride=2)
        trainer(root, [callback], **options).validate(Standard(model).double(), lm_loader(), verbose=False)
        return read_summary(root)

    one = analyse(tmp_path / "one")
    many = analyse(tmp_path / "many", devices=2, strategy="ddp_fork")
    assert one["num_samples"] == many["num_samples"] == 7 * 8  # 7 sequences: the sampler pads one, not counted
    assert_json_close(many, one, atol=1e-6, rtol=1e-6)


def test_gpt_neox_head_is_the_models_own():
    torch.manual_seed(0)
    config = tiny_overrides(
        "gpt_neox", num_hidden_layers=2, hidden_size=32, num_attention_heads=2, intermediate_size=64,
        vocab_size=VOCAB, max_position_embeddings=2048,  # GPT-NeoX's default, which this test was written with
    )  # fmt: skip
    backbone = HFCausalLM(model_type="gpt_neox", config_overrides=config).double().eval()
    batch = text_batch()
    with torch.no_grad():
        own = backbone.model(**batch).logits
        torch.testing.assert_close(backbone.head(backbone(batch)[-1]), own, rtol=0, atol=1e-12)
