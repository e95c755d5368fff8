"""``layerwise export``: the first d blocks plus the shared head as a standalone model, reloaded from disk.

Every exported model is reloaded the way a user would (``torch.load`` of the pickled module, ``from_pretrained`` of
the Hugging Face folder) and compared with the layerwise module's own layer-d logits. Models are tiny real timm /
Hugging Face architectures built offline from their configs (sizes asserted).
"""

import json

import lightning
import pytest
import timm
import torch
from helpers import digits, tiny_backbone
from tiny_models import DECODERS, ENCODERS, LM_LAYERS, LM_VOCAB, LM_WIDTH
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from layerwise.cli import main as cli_main
from layerwise.commands.export import choose_depth, export_truncated
from layerwise.features import HFCausalLM, HFEncoder, TimmViT
from layerwise.lightning_modules import Standard


def main(argv):
    cli_main(["export", *argv])


LAYERS, WIDTH, VOCAB = LM_LAYERS, LM_WIDTH, LM_VOCAB  # the shared language-model backbones of tiny_models
EXPORTED_ENCODERS = ("bert", "distilbert")
# Qwen2 at the LLaMA sizes: its config lists one attention type per layer (`layer_types`), the export must cut it to d
EXPORTED_DECODERS = {**DECODERS, "qwen2": DECODERS["llama"]}
TIMM_ARGS = dict(num_classes=10, img_size=8, patch_size=2, in_chans=1, embed_dim=16, depth=4, num_heads=2)


def timm_module(pooling: str) -> Standard:
    if pooling == "cls":
        return Standard(tiny_backbone(seed=1)).eval()
    torch.manual_seed(1)
    backbone = TimmViT(**TIMM_ARGS, pooling="mean")
    assert backbone.num_layers == 4 and backbone.model.global_pool == "avg"
    return Standard(backbone).eval()


def text_inputs(batch_size: int = 3, length: int = 9) -> dict:
    """Token ids with right padding in row 1 (its last 3 positions)."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(2, VOCAB, (batch_size, length), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, -3:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def load_pickled(path):
    model = torch.load(path, weights_only=False)
    assert not any(type(m).__module__.startswith("layerwise") for m in model.modules()), "must not need layerwise"
    return model.eval()


def close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-5)


def layer_logits(module, batch):
    """The shared head's logits at every layer ``(L, B, C)``: what an export at depth d reproduces at layer d."""
    with torch.no_grad():
        inputs, _ = module.backbone.split_batch(batch)
        return module.backbone.head(module.backbone(inputs))


# ---------------------------------------------------------------------------------------------------------- timm
@pytest.mark.parametrize(("pooling", "depth"), [("cls", 2), ("mean", 1), ("mean", 4)])
def test_timm_export_reproduces_the_shared_head_at_layer_d(pooling, depth, tmp_path) -> None:
    module = timm_module(pooling)
    _, _, x, y = digits()
    x, y = x[:24], y[:24]
    expected = layer_logits(module, (x, y))[depth - 1]

    result = export_truncated(module, depth, tmp_path / "out")
    assert result.checkpoint == tmp_path / "out" / f"model_depth_{depth}.pt" and result.hf_folder is None
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [f"model_depth_{depth}.pt"]
    model = load_pickled(result.checkpoint)
    assert isinstance(model, timm.models.VisionTransformer) and len(model.blocks) == depth
    assert model.global_pool == {"cls": "token", "mean": "avg"}[pooling]
    with torch.no_grad():
        close(model(x), expected)
        assert not torch.allclose(model(x), layer_logits(module, (x, y))[depth % 4], atol=1e-3)
    # its weights are copies: the source module is unchanged by using or training the export
    with torch.no_grad():
        model.head.weight.add_(1.0)
    close(layer_logits(module, (x, y))[depth - 1], expected)


# --------------------------------------------------------------------------------------------------- Hugging Face
@pytest.mark.parametrize("model_type", EXPORTED_ENCODERS)
def test_hf_encoder_export_reproduces_the_shared_head_at_layer_d(model_type, tmp_path) -> None:
    torch.manual_seed(0)
    backbone = HFEncoder(model_type=model_type, num_classes=3, config_overrides=ENCODERS[model_type])
    assert (backbone.num_layers, backbone.embed_dim, backbone.num_classes) == (LAYERS, WIDTH, 3)
    module = Standard(backbone).eval()
    inputs = text_inputs()
    expected = layer_logits(module, {**inputs, "labels": torch.tensor([0, 1, 2])})[1]

    result = export_truncated(module, 2, tmp_path)
    for model in (
        load_pickled(result.checkpoint),
        AutoModelForSequenceClassification.from_pretrained(result.hf_folder),
    ):
        assert model.config.num_hidden_layers == 2 and type(model) is type(backbone.model)
        with torch.no_grad():
            close(model.eval()(**inputs).logits, expected)
    saved = json.loads((result.hf_folder / "config.json").read_text())
    assert saved[{"bert": "num_hidden_layers", "distilbert": "n_layers"}[model_type]] == 2


@pytest.mark.parametrize("model_type", list(EXPORTED_DECODERS))
def test_hf_causal_lm_export_reproduces_the_shared_head_at_layer_d(model_type, tmp_path) -> None:
    torch.manual_seed(0)
    backbone = HFCausalLM(model_type=model_type, config_overrides=EXPORTED_DECODERS[model_type])
    assert (backbone.num_layers, backbone.embed_dim, backbone.num_classes) == (LAYERS, WIDTH, VOCAB)
    backbone.eval()
    inputs = text_inputs()
    with torch.no_grad():
        expected = backbone.head(backbone(inputs)[1])  # (B, T, V)

    result = export_truncated(Standard(backbone), 2, tmp_path)
    reloaded = AutoModelForCausalLM.from_pretrained(result.hf_folder).eval()
    for model in (load_pickled(result.checkpoint), reloaded):
        assert model.config.num_hidden_layers == 2 and len(model.get_submodule(backbone.paths.blocks)) == 2
        with torch.no_grad():
            close(model(**inputs).logits, expected)
    saved = json.loads((result.hf_folder / "config.json").read_text())
    assert saved[{"gpt2": "n_layer"}.get(model_type, "num_hidden_layers")] == 2
    if model_type == "qwen2":
        assert len(backbone.model.config.layer_types) == LAYERS and saved["layer_types"] == ["full_attention"] * 2
    # the LM head reloads to the source's weights; GPT-2 ties it to the token embedding, and it stays tied
    source_head, head = backbone.model.get_output_embeddings().weight, reloaded.get_output_embeddings().weight
    torch.testing.assert_close(head, source_head, rtol=0, atol=0)
    tied = reloaded.get_input_embeddings().weight.data_ptr() == head.data_ptr()
    assert tied == (model_type == "gpt2") == backbone.model.config.tie_word_embeddings


# ---------------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("depth", [0, 5, -1])
def test_bad_depth_names_the_flag_and_writes_nothing(depth, tmp_path) -> None:
    with pytest.raises(ValueError, match="--depth"):
        export_truncated(timm_module("cls"), depth, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_failed_export_leaves_nothing_half_written(tmp_path, monkeypatch) -> None:
    torch.manual_seed(0)
    backbone = HFCausalLM(model_type="gpt2", config_overrides=DECODERS["gpt2"])
    out = tmp_path / "out"
    first = export_truncated(backbone, 2, out)
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    def broken_save_pretrained(self, folder, **kwargs):
        folder.mkdir()
        (folder / "config.json").write_text("{")  # half written, then the disk fills up
        raise OSError("No space left on device")

    monkeypatch.setattr(type(backbone.model), "save_pretrained", broken_save_pretrained)
    for depth in (1, 2):  # a new depth, and one replacing the existing export
        with pytest.raises(OSError, match="No space"):
            export_truncated(backbone, depth, out, verify=False)
        assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
        assert sorted(p.name for p in out.iterdir()) == ["hf_depth_2", "model_depth_2.pt"]
    with pytest.raises(OSError):
        export_truncated(backbone, 1, tmp_path / "fresh", verify=False)
    assert not (tmp_path / "fresh").exists()
    monkeypatch.undo()
    # a successful re-export replaces the folder as a whole
    export_truncated(backbone, 2, out)
    assert sorted(p.name for p in out.iterdir()) == ["hf_depth_2", "model_depth_2.pt"]
    assert AutoModelForCausalLM.from_pretrained(first.hf_folder).config.n_layer == 2


def test_an_export_that_does_not_reproduce_the_head_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("layerwise.commands.export.exported_logits", lambda model, inputs: model(inputs) + 1e-2)
    with pytest.raises(RuntimeError, match="does not reproduce"):
        export_truncated(timm_module("cls"), 2, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------------------- CLI
def cli_checkpoint(tmp_path) -> tuple:
    """A checkpoint as `layerwise fit` writes it: the module's and backbone's class paths in the hyper-parameters."""
    module = timm_module("mean")
    hyper_parameters = {
        "_instantiator": "lightning.pytorch.cli.instantiate_module",
        "_class_path": "layerwise.lightning_modules.Standard",
        "backbone": {"class_path": "layerwise.features.TimmViT", "init_args": {**TIMM_ARGS, "pooling": "mean"}},
    }
    path = tmp_path / "last.ckpt"
    checkpoint = {"state_dict": module.state_dict(), "hyper_parameters": hyper_parameters}
    torch.save({**checkpoint, "pytorch-lightning_version": lightning.__version__}, path)
    return module, path


def write_summary(path, accuracy) -> None:
    layers = list(range(1, len(accuracy) + 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"stage": "val", "depth": len(accuracy), "layers": layers, "accuracy": accuracy}))


def test_cli_export_at_the_effective_depth_of_a_summary(tmp_path, capsys) -> None:
    module, checkpoint = cli_checkpoint(tmp_path)
    run = tmp_path / "run" / "version_0"
    write_summary(run / "layerwise" / "val_epoch_000.json", [0.1, 0.2, 0.3, 0.4])
    write_summary(run / "layerwise" / "val_epoch_001.json", [0.5, 0.985, 0.995, 1.0])  # the latest epoch
    main(["--checkpoint", str(checkpoint), "--summary", str(tmp_path / "run"), "--out", str(tmp_path / "out")])
    printed = capsys.readouterr().out
    assert "depth 3 of 4" in printed and "layer 3 is the first with Acc_l >= 1 - 0.01" in printed
    _, _, x, y = digits()
    model = load_pickled(tmp_path / "out" / "model_depth_3.pt")
    with torch.no_grad():
        close(model(x[:16]), layer_logits(module, (x[:16], y[:16]))[2])

    # an explicit --depth wins; the summary's suggestion (here for ε = 0.02, from the JSON file itself) is printed
    summary = str(run / "layerwise" / "val_epoch_001.json")
    argv = ["--checkpoint", str(checkpoint), "--summary", summary, "--epsilon", "0.02", "--depth", "1"]
    main([*argv, "--out", str(tmp_path / "b")])
    assert "suggests depth 2" in capsys.readouterr().out
    assert [p.name for p in (tmp_path / "b").iterdir()] == ["model_depth_1.pt"]


def test_choose_depth_absolute_relative_and_unreached() -> None:
    summary = {"layers": [2, 4, 6], "accuracy": [0.81, 0.88, 0.90]}
    assert choose_depth(summary, 0.05, relative=True)[0] == 4
    assert choose_depth(summary, 0.10, relative=True)[0] == 2
    depth, reason = choose_depth(summary, 0.01)
    assert depth == 6 and "no layer reaches" in reason


@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        (["--depth", "0"], "--depth"),
        (["--depth", "5"], "--depth"),  # only the loaded model knows L = 4
        ([], "--depth"),
        (["--summary", "missing.json"], "--summary"),
        (["--depth", "2", "--epsilon", "2"], "--epsilon"),
    ],
)
def test_cli_bad_input_names_the_flag(extra, flag, tmp_path, capsys) -> None:
    _, checkpoint = cli_checkpoint(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(["--checkpoint", str(checkpoint), "--out", str(tmp_path / "out"), *extra])
    assert exit_info.value.code == 2 and flag in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_cli_missing_checkpoint_names_the_flag(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--checkpoint", str(tmp_path / "missing.ckpt"), "--depth", "1", "--out", str(tmp_path / "out")])
    assert "--checkpoint" in capsys.readouterr().err
