"""The hook source: same analysis as the module outputs, models that know nothing of layerwise, the path table for
timm and Hugging Face models, explicit paths, and hooks that never outlive the evaluation epoch.
"""

import lightning.pytorch as pl
import pytest
import timm
import torch
import torch.nn.functional as F
from helpers import (
    CLASSES,
    assert_json_close,
    digits,
    fit_linear_head,
    fitted_module,
    read_features,
    read_summary,
    trainer,
    val_loader,
)
from lightning.pytorch import Callback
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from layerwise.callbacks import LayerwiseAnalysis
from layerwise.features.hooks import HookTap, hook_paths

N = 101


class HookCounter(Callback):
    """Counts the forward hooks on every block after each validation batch (the analysis keeps them until the end)."""

    def __init__(self, blocks):
        self.blocks = blocks
        self.counts = []

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.counts.append(hook_counts(self.blocks))


def hook_counts(blocks) -> list[int]:
    return [len(block._forward_hooks) for block in blocks]


def own_accuracy_and_loss(logits: torch.Tensor, targets: torch.Tensor) -> tuple[float, float]:
    return (logits.argmax(-1) == targets).double().mean().item(), F.cross_entropy(logits.double(), targets).item()


# ----------------------------------------------------------------------------------------------- timm ViT
def test_hook_source_equals_module_outputs(tmp_path):
    runs, counts = {}, {}
    for source in ("outputs", "hooks"):
        module = fitted_module()
        counter = HookCounter(module.backbone.model.blocks)
        callback = LayerwiseAnalysis(source=source, save_features=True, log_figures=False)
        trainer(tmp_path / source, [callback, counter]).validate(module, val_loader(N), verbose=False)
        runs[source] = read_summary(tmp_path / source), read_features(tmp_path / source)
        counts[source] = counter.counts
        assert hook_counts(module.backbone.model.blocks) == [0, 0, 0, 0]
    assert counts["outputs"] == [[0] * 4] * 7 and counts["hooks"] == [[1] * 4] * 7  # the hooks really fed the run
    assert runs["hooks"][0]["num_samples"] == N
    assert_json_close(runs["hooks"][0], runs["outputs"][0], atol=1e-9)
    for key, value in runs["outputs"][1].items():
        torch.testing.assert_close(runs["hooks"][1][key], value, rtol=0, atol=1e-9)


class PlainViT(pl.LightningModule):
    """A LightningModule that knows nothing of layerwise: a timm ViT whose validation step only logs its loss."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = timm.create_model(
            "vit_tiny_patch16_224",
            img_size=8,
            patch_size=2,
            in_chans=1,
            embed_dim=32,
            depth=3,
            num_heads=2,
            num_classes=CLASSES,
        )
        assert len(self.net.blocks) == 3 and self.net.embed_dim == 32 and self.net.num_classes == CLASSES
        x, y, _, _ = digits()
        self.net.eval()
        with torch.no_grad():
            pre_logits = self.net.forward_head(self.net.forward_features(x[::3]), pre_logits=True)
        fit_linear_head(self.net.head, pre_logits, y[::3])  # varied predictions, so accuracy can tell layers apart

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.net(x), y))


def test_plain_lightning_module_with_default_callback(tmp_path):
    module = PlainViT()
    _, _, x, y = digits()
    with torch.no_grad():
        accuracy, loss = own_accuracy_and_loss(module.net.eval()(x[:N]), y[:N])
    assert 0.2 < accuracy < 0.9
    counter = HookCounter(module.net.blocks)
    trainer(tmp_path, [LayerwiseAnalysis(), counter]).validate(module, val_loader(N), verbose=False)
    summary = read_summary(tmp_path)
    assert summary["layers"] == [1, 2, 3] and summary["num_samples"] == N
    assert summary["accuracy"][-1] == pytest.approx(accuracy, abs=1e-12)
    assert summary["loss"][-1] == pytest.approx(loss, rel=1e-5)
    assert counter.counts[0] == [1, 1, 1] and hook_counts(module.net.blocks) == [0, 0, 0]


# --------------------------------------------------------------------------------------- a model off the table
class Residual(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x):
        return x + torch.tanh(self.fc(x))


class TokenModel(pl.LightningModule):
    """Tokens (B, T, 8) -> 3 residual blocks -> first token -> LayerNorm -> Linear; raises at ``fail_at``."""

    def __init__(self, fail_at=None):
        super().__init__()
        torch.manual_seed(0)
        self.encoder = nn.ModuleList([Residual(8) for _ in range(3)])
        self.norm = nn.LayerNorm(8)
        self.fc = nn.Linear(8, 4)
        self.fail_at = fail_at

    def forward(self, x):
        for block in self.encoder:
            x = block(x)
        return self.fc(self.norm(x[:, 0]))

    def validation_step(self, batch, batch_idx):
        if batch_idx == self.fail_at:
            raise RuntimeError("failure in the middle of validation")
        x, y = batch
        self.log("val_loss", F.cross_entropy(self(x), y))


def token_loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(30, 5, 8, generator=g), torch.randint(0, 4, (30,), generator=g)
    return DataLoader(TensorDataset(x, y), batch_size=8)


EXPLICIT = dict(blocks="encoder", final_norm="norm", classifier="fc")


def test_model_outside_the_table_needs_explicit_paths(tmp_path):
    module = TokenModel()
    with pytest.raises(ValueError, match=r"(?s)blocks=.*final_norm=.*classifier="):
        trainer(tmp_path, [LayerwiseAnalysis()]).validate(module, token_loader(), verbose=False)

    counter = HookCounter(module.encoder)
    trainer(tmp_path, [LayerwiseAnalysis(**EXPLICIT), counter]).validate(module, token_loader(), verbose=False)
    x, y = token_loader().dataset.tensors
    with torch.no_grad():
        accuracy, loss = own_accuracy_and_loss(module(x), y)
    summary = read_summary(tmp_path)
    assert summary["layers"] == [1, 2, 3] and summary["num_samples"] == 30
    assert summary["accuracy"][-1] == pytest.approx(accuracy, abs=1e-12)
    assert summary["loss"][-1] == pytest.approx(loss, rel=1e-5)
    assert counter.counts == [[1, 1, 1]] * 4 and hook_counts(module.encoder) == [0, 0, 0]


def test_hooks_removed_after_an_exception_mid_validation(tmp_path):
    module = TokenModel(fail_at=2)
    counter = HookCounter(module.encoder)
    with pytest.raises(RuntimeError, match="middle of validation"):
        trainer(tmp_path, [LayerwiseAnalysis(**EXPLICIT), counter]).validate(module, token_loader(), verbose=False)
    assert counter.counts == [[1, 1, 1]] * 2
    assert hook_counts(module.encoder) == [0, 0, 0]


# ------------------------------------------------------------------------------------------- Hugging Face
def hf_model(family: str) -> nn.Module:
    """A tiny Hugging Face sequence classifier built offline from its config (2 layers, width 32, 3 labels)."""
    transformers = pytest.importorskip("transformers")
    from tiny_models import tiny_config

    torch.manual_seed(0)
    tokens = dict(vocab_size=100, num_labels=3, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if family == "bert":
        config = tiny_config(
            "bert", hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=512, **tokens,
        )  # fmt: skip
        model = transformers.BertForSequenceClassification(config)
    elif family == "gpt2":
        config = tiny_config("gpt2", n_embd=32, n_layer=2, n_head=2, n_positions=16, **tokens)
        model = transformers.GPT2ForSequenceClassification(config)
    else:
        config = tiny_config(
            "llama",
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            intermediate_size=64,
            max_position_embeddings=16,
            **tokens,
        )
        model = transformers.LlamaForSequenceClassification(config)
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 32 and model.num_labels == 3
    return model.eval()


def text_batch(size: int = 4, length: int = 7, seed: int = 0) -> dict[str, torch.Tensor]:
    """Right-padded token ids (pad id 0) of lengths 7, 5, 3, 6, ... with their attention mask and labels."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, 100, (size, length), generator=g)
    lengths = torch.tensor([7, 5, 3, 6] * (size // 4))
    attention_mask = (torch.arange(length) < lengths[:, None]).long()
    input_ids[attention_mask == 0] = 0
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "labels": torch.randint(0, 3, (size,), generator=g),
    }


@pytest.mark.parametrize("family", ["bert", "gpt2", "llama"])
def test_hf_path_table_and_tap_reproduce_the_model(family):
    model = hf_model(family)
    batch = text_batch()
    with torch.no_grad():
        output = model(**batch, output_hidden_states=True)  # transformers keeps a capturing hook on every layer
    paths = hook_paths(model, pooling=None if family == "bert" else "last")
    blocks = model.get_submodule(paths.blocks)
    before = hook_counts(blocks)
    tap = HookTap(model, paths)
    tap.attention_mask = batch["attention_mask"]
    with torch.no_grad(), tap.attached():
        assert hook_counts(blocks) == [count + 1 for count in before]
        model(**batch)
        taken = tap.pop()
    assert hook_counts(blocks) == before

    logits = tap.head(taken)
    assert taken.shape == (2, 4, 32) and logits.shape == (2, 4, 3)
    torch.testing.assert_close(logits[-1], output.logits, rtol=0, atol=1e-5)
    # layer l is the residual stream after block l: hidden_states[l + 1] (the last one is post final norm in HF
    # decoders, so it is checked through the logits above)
    rows = torch.arange(4)
    position = torch.zeros(4, dtype=torch.long) if family == "bert" else batch["attention_mask"].sum(1) - 1
    torch.testing.assert_close(taken[0], output.hidden_states[1][rows, position], rtol=0, atol=1e-6)

    if family != "bert":  # the mask decides which token is the last real one
        tap.attention_mask = None
        with torch.no_grad(), tap.attached():
            model(**batch)
            unmasked = tap.pop()
        padded = batch["attention_mask"][:, -1] == 0
        assert not torch.allclose(tap.head(unmasked)[-1][padded], output.logits[padded], atol=1e-3)


class TextClassifier(pl.LightningModule):
    """A Hugging Face classifier in a LightningModule that only logs its loss, fed dict batches."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.model(**batch).loss)


def test_hf_dict_batches_through_the_callback(tmp_path):
    module = TextClassifier(hf_model("gpt2"))
    batch = text_batch(size=24, seed=1)
    samples = [{key: value[i] for key, value in batch.items()} for i in range(24)]
    loader = DataLoader(samples, batch_size=8)
    with torch.no_grad():
        logits = module.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    accuracy, loss = own_accuracy_and_loss(logits, batch["labels"])
    trainer(tmp_path, [LayerwiseAnalysis()]).validate(module, loader, verbose=False)
    summary = read_summary(tmp_path)
    assert summary["layers"] == [1, 2] and summary["num_samples"] == 24
    assert summary["accuracy"][-1] == pytest.approx(accuracy, abs=1e-12)
    assert summary["loss"][-1] == pytest.approx(loss, rel=1e-5)


class Block(nn.Module):
    """x + MLP(LN(x)) on (B, d): the residual stream after the block is its output."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(x)


class ResidualMLP(nn.Module):
    """A user's own model: residual MLP blocks on (B, d) features, no token axis."""

    def __init__(self, width: int = 16, depth: int = 3, classes: int = 10) -> None:
        super().__init__()
        self.embed = nn.Linear(64, width)
        self.blocks = nn.ModuleList(Block(width) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x.flatten(1))
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


class UserModule(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = ResidualMLP()

    def validation_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)


def test_a_users_mlp_with_block_outputs_of_one_token_is_analysed(tmp_path):
    callback = LayerwiseAnalysis(blocks="net.blocks", final_norm="net.norm", classifier="net.head", log_figures=False)
    module = UserModule()
    trainer(tmp_path, [callback]).validate(module, val_loader(101), verbose=False)
    summary = read_summary(tmp_path)
    assert summary["num_samples"] == 101 and summary["depth"] == 3
    x, y = val_loader(101).dataset.tensors
    with torch.no_grad():  # an independent reference: layer 3's prediction through the model's own norm and head
        h = module.net.embed(x.flatten(1))
        for block in module.net.blocks:
            h = h + block.mlp(h)
        accuracy = (module.net.head(module.net.norm(h)).argmax(-1) == y).double().mean().item()
    assert summary["accuracy"][-1] == pytest.approx(accuracy, abs=1e-12)
