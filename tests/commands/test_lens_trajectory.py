"""`layerwise lens --trajectory`: the prediction trajectory of a prompt against a float64 computation written here from
the definitions (Hugging Face's own hidden states, GPT-2's final norm and tied unembedding, a softmax), for the logit
lens and for a tuned lens of known random translators; the command end to end; its errors, before any work."""

import copy
import json
from pathlib import Path

import pytest
import torch
from tiny_models import tiny_config
from transformers import AutoModelForCausalLM

from layerwise.cli import main as cli_main
from layerwise.commands.lens import TRAJECTORY_FILES, lens_trajectory
from layerwise.datamodules.tokenizers import byte_tokenizer
from layerwise.engines.lens import Translators, save_translators

LAYERS, WIDTH, PROMPT = 3, 16, "Once upon a"


@pytest.fixture(scope="module")
def model():
    """A tiny random GPT-2 (3 blocks, byte vocabulary), its weights spread so the layers disagree."""
    torch.manual_seed(0)
    config = tiny_config("gpt2", n_layer=LAYERS, n_embd=WIDTH, n_head=2, vocab_size=257, n_positions=32)
    config.update(dict(initializer_range=0.5, bos_token_id=256, eos_token_id=256))
    built = AutoModelForCausalLM.from_config(config).eval()
    assert (built.config.n_layer, built.config.n_embd) == (LAYERS, WIDTH)
    return built


@pytest.fixture(scope="module")
def translators():
    known = Translators(LAYERS, WIDTH)
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for parameter in known.parameters():
            parameter.copy_(0.3 * torch.randn(parameter.shape, generator=generator))
    return known


def reference(model, prompt: str, translators=None) -> dict:
    """Every layer's distribution over the next token in float64, from ``output_hidden_states`` by hand.

    Hugging Face's ``hidden_states[l]`` is the residual after block ``l`` for ``l < L``; its last entry has GPT-2's
    final norm applied already, so the last layer's logits are ``lm_head(hidden_states[L])``, the model's own.
    """
    double = AutoModelForCausalLM.from_config(model.config).double().eval()
    double.load_state_dict(model.state_dict())
    ids = byte_tokenizer()(prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        output = double(input_ids=ids, output_hidden_states=True)
    norm, unembed = double.transformer.ln_f, double.lm_head.weight
    logits = []
    for layer in range(1, LAYERS + 1):
        h = output.hidden_states[layer][0]
        if layer == LAYERS:
            logits.append(h @ unembed.T)
            continue
        if translators is not None:
            t = translators.translators[layer - 1]
            h = h + h @ t.weight.double().T + t.bias.double()
        mean, var = h.mean(-1, keepdim=True), h.var(-1, unbiased=False, keepdim=True)
        logits.append(((h - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias) @ unembed.T)
    logits = torch.stack(logits)  # (L, P, V)
    torch.testing.assert_close(logits[-1], output.logits[0])  # the last layer read is the model's output
    log_p = logits.log_softmax(-1)
    p = log_p.exp()
    final = p[-1:]
    return {
        "top_ids": p.argmax(-1),
        "probability": p.max(-1).values,
        "entropy": -(p * log_p).sum(-1),
        "kl_to_final": (final * (final.log() - log_p)).sum(-1),
        "input_ids": ids[0].tolist(),
    }


def test_the_trajectory_equals_a_float64_computation_for_the_logit_and_a_tuned_lens(model, translators):
    lenses = {"logit lens": None, "tuned lens": translators}
    trajectory = lens_trajectory(model, byte_tokenizer(), PROMPT, lenses)
    assert trajectory["layers"] == [1, 2, 3] and trajectory["positions"] == list(range(len(PROMPT)))
    assert trajectory["input_tokens"] == list(PROMPT)  # the byte tokenizer: one token per character
    assert [panel["name"] for panel in trajectory["lenses"]] == ["logit lens", "tuned lens"]
    for panel, weights in zip(trajectory["lenses"], (None, translators)):
        expected = reference(model, PROMPT, weights)
        assert trajectory["input_ids"] == expected["input_ids"]
        assert panel["top_ids"] == expected["top_ids"].tolist()
        assert panel["tokens"] == [[byte_tokenizer().decode([i]) for i in row] for row in panel["top_ids"]]
        for key in ("probability", "entropy", "kl_to_final"):  # the model in float32 against float64
            torch.testing.assert_close(torch.tensor(panel[key], dtype=torch.float64), expected[key], atol=2e-5, rtol=0)
    logit, tuned = trajectory["lenses"]
    assert logit["probability"][-1] == tuned["probability"][-1]  # the last layer: the model's head, both lenses
    assert logit["top_ids"][0] != tuned["top_ids"][0]  # the translators change what layer 1 predicts
    assert max(max(row) for row in logit["kl_to_final"][:-1]) > 0.1 and logit["kl_to_final"][-1] == [0.0] * 11


def test_rows_keep_the_final_layer_as_the_kl_reference(model):
    every = lens_trajectory(model, byte_tokenizer(), PROMPT, {"logit lens": None})["lenses"][0]
    first = lens_trajectory(model, byte_tokenizer(), PROMPT, {"logit lens": None}, layers=[0])
    assert first["layers"] == [1]
    assert first["lenses"][0]["kl_to_final"] == every["kl_to_final"][:1]  # still against layer 3, not layer 1


def test_the_command_writes_the_numbers_and_the_figures_and_keeps_them(model, translators, tmp_path, capsys):
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    lens_file = save_translators(tmp_path / "tuned_lens.safetensors", translators)
    out = tmp_path / "run"
    argv = ["lens", "--model", str(folder), "--tokenizer", "byte", "--prompt", PROMPT, "--trajectory", "true"]
    cli_main([*argv, "--lens", str(lens_file), "--statistic", "kl", "--no_title", "true", "--out", str(out)])
    printed = capsys.readouterr().out.split()
    assert printed == [str(out / name) for name in TRAJECTORY_FILES]
    assert sorted(path.name for path in out.iterdir()) == sorted(TRAJECTORY_FILES)  # no lens.md: no generation
    record = json.loads((out / "lens_trajectory.json").read_text())
    assert record["format"] == "layerwise.lens_trajectory" and record["statistic"] == "kl_to_final"
    expected = lens_trajectory(model, byte_tokenizer(), PROMPT, {"logit lens": None, "tuned lens": translators})
    for panel, again in zip(record["lenses"], expected["lenses"]):
        assert panel["top_ids"] == again["top_ids"]
        torch.testing.assert_close(torch.tensor(panel["kl_to_final"]), torch.tensor(again["kl_to_final"]))
    assert (out / "lens_trajectory.pdf").read_bytes().startswith(b"%PDF")
    assert (out / "lens_trajectory.png").read_bytes().startswith(b"\x89PNG")
    from PIL import Image

    with Image.open(out / "lens_trajectory.png") as image:  # --no_title: the title in the file's metadata instead
        assert image.text["Title"] == f"prediction trajectory: {PROMPT.replace(' ', '␣')}"
    before = (out / "lens_trajectory.json").read_bytes()
    with pytest.raises(SystemExit):  # an earlier trajectory is kept: one line, nothing written
        cli_main([*argv, "--out", str(out)])
    assert "already holds lens_trajectory.json" in capsys.readouterr().err
    assert (out / "lens_trajectory.json").read_bytes() == before
    cli_main([*argv, "--layers", "1", "3", "--out", str(out), "--overwrite", "true"])  # the logit lens alone
    again = json.loads((out / "lens_trajectory.json").read_text())
    assert again["layers"] == [1, 3] and [p["name"] for p in again["lenses"]] == ["logit lens"]


def error_line(argv: list, capsys) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli_main(argv)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("layerwise lens: error:")]
    assert len(lines) == 1, lines
    return lines[0]


def test_bad_trajectory_options_are_one_line_naming_the_option_before_any_work(model, tmp_path, capsys):
    missing = ["lens", "--model", str(tmp_path / "no_such_model"), "--prompt", "a", "--out", str(tmp_path / "out")]
    line = error_line([*missing, "--statistic", "kl"], capsys)  # before the model: its folder is not there
    assert "--statistic=kl" in line and "--trajectory true" in line
    assert "--no_title" in error_line([*missing, "--no_title", "true"], capsys)
    assert "--statistic" in error_line([*missing, "--trajectory", "true", "--statistic", "rank"], capsys)
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "lens_trajectory.json").write_text("an earlier run")
    line = error_line([*missing[:-1], str(kept), "--trajectory", "true"], capsys)  # before the model it cannot load
    assert "already holds lens_trajectory.json" in line and "no_such_model" not in line
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    argv = ["lens", "--model", str(folder), "--tokenizer", "byte", "--trajectory", "true", "--out", str(tmp_path / "o")]
    line = error_line([*argv, "--prompt", "x" * 40], capsys)  # 40 tokens, the model reads 32
    assert "`--prompt` has 40 tokens" in line and "32" in line
    assert "--layers" in error_line([*argv, "--prompt", "a", "--layers", "4"], capsys)
    lens_file = save_translators(tmp_path / "wide.safetensors", Translators(LAYERS, 2 * WIDTH))
    assert "--lens" in error_line([*argv, "--prompt", "a", "--lens", str(lens_file)], capsys)
    assert not (tmp_path / "o").exists() and not (tmp_path / "out").exists()
    assert [path.name for path in kept.iterdir()] == ["lens_trajectory.json"]


# ------------------------------------------------------------------------------------------- a classifier's sample
CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.fixture(scope="module")
def vit_run(tmp_path_factory) -> Path:
    """The quickstart cut to 3 blocks of width 16 and 2 training steps: its run folder (config.yaml, a checkpoint)."""
    from layerwise.cli import LayerwiseCLI

    root = tmp_path_factory.mktemp("vit_run")
    LayerwiseCLI(
        args=[
            "fit",
            f"--config={CONFIGS / 'quickstart.yaml'}",
            "--model.init_args.backbone.init_args.embed_dim=16",
            "--model.init_args.backbone.init_args.depth=3",
            "--trainer.max_epochs=1",
            "--trainer.limit_train_batches=2",
            "--trainer.limit_val_batches=0",
            "--trainer.enable_progress_bar=false",
            "--trainer.enable_model_summary=false",
            "--trainer.callbacks=[]",
            f"--trainer.logger.init_args.save_dir={root}",
        ]
    )
    run = root / "quickstart" / "version_0"
    assert (run / "config.yaml").is_file() and len(list((run / "checkpoints").glob("*.ckpt"))) == 1
    return run


def vit_reference(backbone, x: torch.Tensor, translators=None) -> dict:
    """Every layer's class distribution in float64 from timm's own pieces: forward hooks on the blocks, then the
    model's ``forward_head`` (mean of the patch tokens, ``fc_norm``, classifier); with a tuned lens the translator
    acts on the pooled feature, before ``fc_norm``."""
    model = copy.deepcopy(backbone.model).double().eval()
    assert isinstance(model.norm, torch.nn.Identity) and model.global_pool == "avg"  # what the reference assumes
    outputs = []
    hooks = [block.register_forward_hook(lambda _m, _i, out: outputs.append(out)) for block in model.blocks]
    with torch.no_grad():
        final = model(x.double())
        for hook in hooks:
            hook.remove()
        logits = []
        for layer, h in enumerate(outputs):
            pooled = h[:, model.num_prefix_tokens :].mean(1)
            if translators is not None and layer < len(outputs) - 1:
                t = translators.translators[layer]
                pooled = pooled + pooled @ t.weight.double().T + t.bias.double()
            logits.append(model.head(model.fc_norm(pooled)))
    logits = torch.stack(logits)[:, 0]  # (L, C)
    torch.testing.assert_close(logits[-1], final[0])  # the last layer read is the model's own output
    log_p = logits.log_softmax(-1)
    p = log_p.exp()
    return {
        "top_ids": p.argmax(-1),
        "probability": p.max(-1).values,
        "entropy": -(p * log_p).sum(-1),
        "kl_to_final": (p[-1:] * (p[-1:].log() - log_p)).sum(-1),
    }


@pytest.mark.filterwarnings("ignore:.*does not have many workers")
def test_a_classifiers_sample_is_one_column_equal_to_a_float64_computation(vit_run, tmp_path, capsys):
    from layerwise.datamodules import DigitsDataModule
    from layerwise.engines.checkpoint import load_module

    checkpoint = next((vit_run / "checkpoints").glob("*.ckpt"))
    backbone = load_module(checkpoint).backbone
    known = Translators(backbone.num_layers, backbone.embed_dim)
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for parameter in known.parameters():
            parameter.copy_(0.5 * torch.randn(parameter.shape, generator=generator))
    lens_file = save_translators(tmp_path / "tuned_lens.safetensors", known)
    out = tmp_path / "out"
    argv = ["lens", "--checkpoint", str(checkpoint), "--trajectory", "true", "--sample", "7", "--out", str(out)]
    cli_main([*argv, "--lens", str(lens_file)])
    record = json.loads((out / "lens_trajectory.json").read_text())
    data = DigitsDataModule(val_fraction=0.2, seed=0)  # the quickstart's data
    data.setup("validate")
    x, label = data.val_set[7]
    assert record["kind"] == "classifier" and record["label"] == int(label) and record["positions"] == [0]
    assert record["layers"] == [1, 2, 3] and record["input_tokens"] == [f"label {int(label)}"]
    for panel, weights in zip(record["lenses"], (None, known)):
        expected = vit_reference(backbone, x[None], weights)
        assert panel["top_ids"] == [[i] for i in expected["top_ids"].tolist()]
        assert panel["tokens"] == [[str(i)] for i in expected["top_ids"].tolist()]  # digits: the class index
        for key in ("probability", "entropy", "kl_to_final"):
            got = torch.tensor(panel[key], dtype=torch.float64)[:, 0]
            torch.testing.assert_close(got, expected[key], atol=1e-5, rtol=0)
    assert record["lenses"][0]["probability"] != record["lenses"][1]["probability"]
    # bad input: one line naming the option, nothing written
    error = tmp_path / "error"
    bad = ["lens", "--checkpoint", str(checkpoint), "--trajectory", "true", "--out", str(error)]
    assert "`--sample=360`: the evaluation set has 360 samples" in error_line([*bad, "--sample", "360"], capsys)
    assert "--trajectory true" in error_line([*bad[:3], "--sample", "1", "--out", str(error)], capsys)
    assert "--sample=-1" in error_line([*bad, "--sample", "-1"], capsys)
    assert "give one" in error_line([*bad, "--sample", "1", "--prompt", "a"], capsys)
    assert "--layers" in error_line([*bad, "--sample", "1", "--layers", "4"], capsys)
    assert not error.exists()
