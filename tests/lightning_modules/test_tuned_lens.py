"""The tuned lens: its translators and loss against the paper's definition, against the tuned-lens package, trained on
Tiny Shakespeare, and on 1 and 2 processes."""

from functools import partial
from pathlib import Path

import helpers
import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from helpers import FROZEN_IN_EVAL, TRAINING_ONLY
from tiny_models import LM_LAYERS, LM_WIDTH, decoder, encoder, lm_loader
from torch.utils.data import DataLoader

from layerwise.engines.lens import Translators, load_translators, save_translators
from layerwise.engines.readout import chunked_readout
from layerwise.errors import UsageError
from layerwise.features import FEATURES, HFCausalLM
from layerwise.lightning_modules import Standard, TunedLens

SHARED = [
    Path(__file__).resolve().parents[2] / ".." / "shared",
    Path("/work/shared"),
]  # beside the checkout, or a worktree's
SHAKESPEARE = next(
    (path for path in (root / "data" / "tinyshakespeare" / "input.txt" for root in SHARED) if path.is_file()), SHARED[0]
)


def randomised(lens: TunedLens, seed: int = 0, scale: float = 0.3) -> TunedLens:
    """Random translators (they start at zero, which would make every check below trivial)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in lens.translators.parameters():
            parameter.copy_(scale * torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype))
    return lens


def reference_logits(backbone: HFCausalLM, h: torch.Tensor, weight=None, bias=None) -> torch.Tensor:
    """The paper's lens in float64 from the model's own weights: LayerNorm(h + A h + b) @ W_U^T (GPT-2, tied)."""
    h = h.double()
    if weight is not None:
        h = h + h @ weight.double().T + bias.double()
    norm = backbone.model.transformer.ln_f
    mean, var = h.mean(-1, keepdim=True), h.var(-1, unbiased=False, keepdim=True)
    normed = (h - mean) / torch.sqrt(var + norm.eps) * norm.weight.double() + norm.bias.double()
    return normed @ backbone.model.lm_head.weight.double().T


def test_translators_start_at_the_identity_and_the_lens_is_then_the_logit_lens():
    lens = TunedLens(backbone=decoder("gpt2"))
    assert len(lens.translators.translators) == LM_LAYERS - 1  # the last layer has no translator
    assert all(float(p.detach().abs().sum()) == 0.0 for p in lens.translators.parameters())
    features = torch.randn(LM_LAYERS, 11, LM_WIDTH, dtype=torch.float64)
    tuned = chunked_readout(lens.reading_heads(), features, reference=True)
    logit = chunked_readout(lens.backbone.head, features, reference=True)
    for field in ("predictions", "max_prob", "entropy", "kl_to_final", "final_rank"):
        torch.testing.assert_close(getattr(tuned, field), getattr(logit, field), rtol=0, atol=0)


def test_translator_forward_and_loss_equal_the_papers_definition_in_float64():
    backbone = decoder("gpt2")
    lens = randomised(TunedLens(backbone=backbone).double())
    batch = next(iter(lm_loader()))
    outputs = lens.samples(batch)
    features = outputs[FEATURES]
    final = torch.log_softmax(reference_logits(backbone, features[-1]), -1)
    expected_kl = []
    for layer, (translator, head) in enumerate(zip(lens.translators.translators, lens.reading_heads())):
        expected = reference_logits(backbone, features[layer], translator.weight, translator.bias)
        torch.testing.assert_close(head(features[layer]), expected, rtol=1e-10, atol=1e-10)
        log_q = torch.log_softmax(expected, -1)
        keep = outputs["targets"] != -100
        expected_kl.append((final.exp() * (final - log_q)).sum(-1)[keep].mean())
    kl = lens.layer_kl(outputs)
    torch.testing.assert_close(kl, torch.stack(expected_kl), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(lens.compute_loss(outputs), torch.stack(expected_kl).sum(), rtol=1e-10, atol=1e-12)
    # the readout's per-row statistics of the same lens, against the reference
    readout = chunked_readout(lens.reading_heads(), features, None, chunk_size=5, reference=True)
    for layer in range(LM_LAYERS):
        weight = None if layer == LM_LAYERS - 1 else lens.translators.translators[layer].weight
        bias = None if weight is None else lens.translators.translators[layer].bias
        log_q = torch.log_softmax(reference_logits(backbone, features[layer], weight, bias), -1)
        torch.testing.assert_close(readout.kl_to_final[layer], (final.exp() * (final - log_q)).sum(-1))
        torch.testing.assert_close(readout.entropy[layer], -(log_q.exp() * log_q).sum(-1))
        top = final.argmax(-1, keepdim=True)
        rank = 1 + (log_q > log_q.gather(-1, top)).sum(-1)
        torch.testing.assert_close(readout.final_rank[layer], rank.double())
    assert float(readout.kl_to_final[-1].abs().max()) < 1e-12 and bool((readout.final_rank[-1] == 1).all())


def test_per_layer_logits_equal_the_tuned_lens_package_with_the_same_translators():
    """Only where the `tuned-lens` package installs beside our pins (its own venv: see the report)."""
    lenses = pytest.importorskip("tuned_lens.nn.lenses")
    backbone = decoder("gpt2")
    ours = randomised(TunedLens(backbone=backbone).double())
    theirs = lenses.TunedLens.from_model(backbone.model).double()
    with torch.no_grad():  # their translator l reads hidden_states[l]; ours for layer l (1-based) is the same residual
        for layer, translator in enumerate(ours.translators.translators, 1):
            theirs.layer_translators[layer].weight.copy_(translator.weight)
            theirs.layer_translators[layer].bias.copy_(translator.bias)
    batch = next(iter(lm_loader()))
    with torch.no_grad():
        hidden = backbone.model(input_ids=batch["input_ids"], output_hidden_states=True).hidden_states
        features = ours.samples(batch)[FEATURES]
        for layer, head in enumerate(ours.reading_heads()[:-1], 1):
            expected = theirs(hidden[layer], idx=layer).flatten(0, 1)
            torch.testing.assert_close(head(features[layer - 1]), expected, rtol=1e-5, atol=1e-5)


def test_the_translators_file_loads_without_pickle_and_refuses_other_files(tmp_path):
    translators = Translators(3, 8)
    with torch.no_grad():
        for parameter in translators.parameters():
            parameter.normal_()
    path = save_translators(tmp_path / "lens.safetensors", translators)
    loaded = load_translators(path)
    for (name, value), (_, again) in zip(translators.state_dict().items(), loaded.state_dict().items()):
        torch.testing.assert_close(value, again, rtol=0, atol=0, msg=name)
    torch.save({"a": 1}, tmp_path / "pickled.pt")
    with pytest.raises(UsageError, match="not a safetensors file"):
        load_translators(tmp_path / "pickled.pt")
    with pytest.raises(UsageError, match="no such file"):
        load_translators(tmp_path / "missing.safetensors")


def test_tuned_lens_needs_exactly_one_backbone_source():
    with pytest.raises(ValueError, match="exactly one"):
        TunedLens()
    with pytest.raises(ValueError, match="momentum"):
        TunedLens(backbone=decoder("gpt2"), momentum=1.0)


# the translators' fits validate nothing unless a test asks (limit_val_batches=None)
quiet_trainer = partial(helpers.quiet_trainer, num_sanity_val_steps=0, limit_val_batches=0)


@FROZEN_IN_EVAL
@TRAINING_ONLY
@pytest.mark.filterwarnings("ignore:.*does not have many workers")
def test_a_tuned_lens_on_a_trained_tiny_gpt2_lowers_the_kl_to_the_final_layer_below_the_logit_lens(tmp_path):
    """Real training on Tiny Shakespeare: a 3-block GPT-2 (AdamW, 120 steps), then the default recipe (100 steps)."""
    from layerwise.datamodules import TextDataModule

    if not SHAKESPEARE.is_file():
        pytest.skip("Tiny Shakespeare is not in /work/shared/data")
    torch.manual_seed(0)
    data = TextDataModule(
        train_files=[str(SHAKESPEARE)],
        tokenizer="byte",
        block_size=32,
        batch_size=16,
        max_train_blocks=2000,
        max_val_blocks=32,
        val_fraction=0.1,
    )
    overrides = dict(n_layer=3, n_embd=32, n_head=2, n_positions=64, vocab_size=257, bos_token_id=256)
    overrides.update(eos_token_id=256, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = Standard(HFCausalLM(model_type="gpt2", config_overrides=overrides), optimizer=_adamw)
    quiet_trainer(120, gradient_clip_val=None).fit(model, data)
    lens = TunedLens(backbone=model.backbone)
    data.setup("validate")
    batch = next(iter(data.val_dataloader()))

    def kl_to_final() -> np.ndarray:
        features = lens.samples(batch)[FEATURES]
        return chunked_readout(lens.reading_heads(), features, reference=True).kl_to_final.mean(1).numpy()

    logit = kl_to_final()
    quiet_trainer(100, default_root_dir=tmp_path).fit(lens, data)
    tuned = kl_to_final()
    assert (tuned[:-1] < logit[:-1]).all(), (tuned, logit)
    assert tuned[-1] == logit[-1] == 0.0
    np.testing.assert_allclose(  # the fit wrote the translators it ended with
        load_translators(tmp_path / "tuned_lens.safetensors").translators[0].weight.detach().numpy(),
        lens.translators.translators[0].weight.detach().numpy(),
    )


def _adamw(parameters):
    return torch.optim.AdamW(parameters, lr=3e-3)


class InOrder(pl.LightningDataModule):
    """``lm_loader``'s sequences, each rank taking every ``world_size``-th in order (no shuffling): the global batch of
    step k is the same set of sequences on 1 and 2 processes."""

    def __init__(self, batch_size: int) -> None:
        super().__init__()
        self.rows, self.batch_size = list(lm_loader(num_sequences=24, length=9).dataset), batch_size

    def train_dataloader(self) -> DataLoader:
        rank, world = self.trainer.global_rank, self.trainer.world_size
        return DataLoader(self.rows[rank::world], batch_size=self.batch_size)


@FROZEN_IN_EVAL
@TRAINING_ONLY
@pytest.mark.filterwarnings("ignore:.*does not have many workers")
def test_two_processes_train_the_same_translators_as_one_for_the_same_global_batch(tmp_path):
    """DDP (gloo, 2 processes, 3 sequences each) against 1 process (6): the same global batches in the same order,
    every sequence as long, so the same mean loss and the same steps (momentum, weight decay, clipping, schedule)."""
    translators = {}
    for devices in (1, 2):
        lens = TunedLens(backbone=decoder("gpt2"), lr=0.5).double()
        options = dict(devices=2, strategy="ddp_fork") if devices == 2 else {}
        trainer = quiet_trainer(4, default_root_dir=tmp_path / str(devices), use_distributed_sampler=False, **options)
        trainer.fit(lens, datamodule=InOrder(batch_size=6 // devices))
        translators[devices] = load_translators(tmp_path / str(devices) / "tuned_lens.safetensors")
    moved = [float(p.detach().abs().max()) for p in translators[1].parameters()]
    assert min(moved) > 1e-5  # the translators left their start
    for (name, one), (_, two) in zip(translators[1].state_dict().items(), translators[2].state_dict().items()):
        torch.testing.assert_close(two, one, rtol=1e-9, atol=1e-12, msg=lambda m, name=name: f"{name}: {m}")


@FROZEN_IN_EVAL
def test_a_classifier_backbone_gets_translators_on_its_pooled_features():
    lens = TunedLens(backbone=encoder("bert", num_classes=3))
    assert len(lens.translators.translators) == LM_LAYERS - 1
    assert not any(p.requires_grad for p in lens.backbone.parameters())
    assert all(p.requires_grad for p in lens.translators.parameters())


CONFIGS = Path(__file__).resolve().parents[2] / "configs"
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


@FROZEN_IN_EVAL
@pytest.mark.filterwarnings("ignore:.*does not have many workers")
def test_the_shipped_digits_config_fits_writes_the_lens_and_resumes(tmp_path):
    """configs/tuned_lens/digits_vit.yaml on a quickstart checkpoint (both cut short): the fit writes the translators,
    the evaluation reads every layer through them, and `--ckpt_path last` continues the same run."""
    from layerwise.cli import LayerwiseCLI

    save = f"--trainer.logger.init_args.save_dir={tmp_path}"
    short = ["--trainer.limit_train_batches=3", "--trainer.limit_val_batches=2", *QUIET, save]
    tiny = ["--model.init_args.backbone.init_args.embed_dim=16", "--model.init_args.backbone.init_args.depth=3"]
    LayerwiseCLI(args=["fit", f"--config={CONFIGS / 'quickstart.yaml'}", "--trainer.max_epochs=1", *tiny, *short])
    checkpoint = tmp_path / "quickstart" / "version_0" / "checkpoints" / "last.ckpt"
    lens_config = [
        f"--config={CONFIGS / 'tuned_lens' / 'digits_vit.yaml'}",
        f"--model.init_args.checkpoint={checkpoint}",
        *short,
    ]
    cli = LayerwiseCLI(args=["fit", *lens_config, "--trainer.max_epochs=1"])
    run = tmp_path / "tuned_lens_digits" / "version_0"
    first = load_translators(run / "tuned_lens.safetensors")
    assert len(first.translators) == 2 and float(first.translators[0].weight.detach().abs().max()) > 0
    assert cli.trainer.global_step == 3
    resumed = LayerwiseCLI(args=["fit", *lens_config, "--trainer.max_epochs=2", "--ckpt_path=last"])
    assert resumed.trainer.global_step == 6
    again = load_translators(run / "tuned_lens.safetensors")
    assert not torch.equal(again.translators[0].weight, first.translators[0].weight)
    with pytest.raises(SystemExit):  # no checkpoint given: one line naming the option
        LayerwiseCLI(args=["fit", f"--config={CONFIGS / 'tuned_lens' / 'digits_vit.yaml'}", *short])


@pytest.mark.filterwarnings("ignore:.*does not have many workers")
def test_the_logit_lens_analysis_reads_through_a_tuned_lens_file(tmp_path):
    """`LogitLensMonitor(lens=<file>)` on a plain model: every per-layer quantity is the tuned lens's, and the lens
    statistics equal the readout of the translated heads read directly."""
    from helpers import read_summary

    from layerwise.callbacks import LayerwiseAnalysis, LogitLensMonitor

    backbone = decoder("gpt2")
    lens = randomised(TunedLens(backbone=backbone).double(), scale=0.05)
    path = save_translators(tmp_path / "lens.safetensors", lens.translators)
    loader = lm_loader()
    results = {}
    for name, choice in (("logit", "logit"), ("tuned", str(path))):
        analysis = LayerwiseAnalysis(logit_lens=LogitLensMonitor(lens=choice), log_figures=False, print_table=False)
        trainer = quiet_trainer(1, default_root_dir=tmp_path / name, callbacks=[analysis], limit_val_batches=None)
        trainer.validate(Standard(backbone), loader, verbose=False)
        results[name] = read_summary(tmp_path / name)
    batches = [lens.samples(batch) for batch in loader]
    keep = torch.cat([b["targets"] for b in batches]) != -100
    features = torch.cat([b[FEATURES] for b in batches], dim=1)[:, keep]
    targets = torch.cat([b["targets"] for b in batches])[keep]
    for name, heads in (("logit", backbone.head), ("tuned", lens.reading_heads())):
        readout = chunked_readout(heads, features, targets, reference=True)
        for key, value in (("kl_to_final", readout.kl_to_final), ("entropy", readout.entropy)):
            # the analysis holds the features in float32 (callbacks/_loader.py): equal to float32 rounding
            np.testing.assert_allclose(results[name][key], value.mean(1).numpy(), rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(results[name]["final_rank"], readout.final_rank.mean(1).numpy(), rtol=0)
        expected_accuracy = (readout.predictions == targets).double().mean(1).numpy()
        np.testing.assert_allclose(results[name]["accuracy"], expected_accuracy, rtol=0, atol=1e-12)
    assert results["tuned"]["kl_to_final"][:-1] != results["logit"]["kl_to_final"][:-1]
    with pytest.raises(UsageError, match="no such file"):
        LogitLensMonitor(lens=str(tmp_path / "missing.safetensors"))


def test_the_lens_command_reads_every_layer_through_a_tuned_lens_file(tmp_path, capsys):
    """`layerwise lens --lens <file>`: each row is the tuned lens's top token and probability at the generated
    positions, computed here from the paper's definition on the same hidden states."""
    from tiny_models import tiny_config
    from transformers import AutoModelForCausalLM

    from layerwise.cli import main as cli_main
    from layerwise.commands.lens import lens_table
    from layerwise.datamodules.tokenizers import byte_tokenizer

    torch.manual_seed(0)
    config = tiny_config("gpt2", n_layer=3, n_embd=16, n_head=2, vocab_size=257, n_positions=64)
    config.update(dict(initializer_range=0.5, bos_token_id=256, eos_token_id=256))
    model = AutoModelForCausalLM.from_config(config).eval()
    translators = Translators(3, 16)
    with torch.no_grad():
        for parameter in translators.parameters():
            parameter.normal_(0, 0.3)
    tokenizer = byte_tokenizer()
    table = lens_table(model, tokenizer, "Hello", 4, translators=translators)
    plain = lens_table(model, tokenizer, "Hello", 4)
    ids = tokenizer("Hello", return_tensors="pt")["input_ids"]
    sequence = torch.cat([ids[0], torch.tensor(table.generated_ids[:-1])])[None]
    with torch.no_grad():
        hidden = model(input_ids=sequence, output_hidden_states=True).hidden_states
    start = ids.size(1) - 1
    for layer in range(1, 3):
        h = hidden[layer][0, start:].double()
        t = translators.translators[layer - 1]
        h = h + h @ t.weight.double().T + t.bias.double()
        norm = model.transformer.ln_f
        h = torch.nn.functional.layer_norm(h, (16,), norm.weight.double(), norm.bias.double(), norm.eps)
        probs = (h @ model.lm_head.weight.double().T).softmax(-1)
        assert table.token_ids[layer - 1].tolist() == probs.argmax(-1).tolist()
        torch.testing.assert_close(table.probs[layer - 1].double(), probs.max(-1).values, atol=1e-5, rtol=0)
    torch.testing.assert_close(table.probs[-1], plain.probs[-1])  # the last layer: the model's own head
    assert not torch.allclose(table.probs[0], plain.probs[0])
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    path = save_translators(tmp_path / "lens.safetensors", translators)
    out = tmp_path / "out"
    common = ["lens", "--model", str(folder), "--tokenizer", "byte", "--prompt", "Hello", "--max_new_tokens", "4"]
    cli_main([*common, "--lens", str(path), "--out", str(out)])
    assert (out / "lens.md").is_file() and (out / "lens.png").stat().st_size > 1000
    with pytest.raises(SystemExit):
        cli_main([*common, "--lens", str(tmp_path / "missing.safetensors"), "--out", str(tmp_path / "x")])
    assert "--lens" in capsys.readouterr().err
