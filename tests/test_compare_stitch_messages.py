"""`layerwise compare` and `layerwise stitch` refuse bad options in one line naming their own flags, before work."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from layerwise.cli import main as cli_main

COMMANDS = {"compare": ["--device", "cpu"], "stitch": ["--accelerator", "cpu"]}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)
    out = {}
    for name, vocab in (("a", 260), ("b", 300)):
        config = AutoConfig.for_model("gpt2", n_layer=2, n_embd=16, n_head=2, vocab_size=vocab, n_positions=64)
        AutoModelForCausalLM.from_config(config).save_pretrained(root / name)
        out[name] = str(root / name)
    (root / "empty.txt").write_text("")
    (root / "short.txt").write_text("hello there\n")
    (root / "long.txt").write_text("the quick brown fox jumps over the lazy dog. " * 100)
    out["root"] = root
    return out


def error_line(command: str, argv: list, capsys) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli_main([command, *argv, *COMMANDS[command]])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith(f"layerwise {command}: error:")]
    assert len(lines) == 1, lines
    assert "--data.init_args" not in lines[0] and "model_name_or_path" not in lines[0]
    assert "config_overrides" not in lines[0] and "model_type" not in lines[0]
    return lines[0]


@pytest.mark.parametrize("command", COMMANDS)
def test_block_size_beyond_the_models_positions_is_refused(folders, tmp_path, capsys, command):
    base = ["--model_a", folders["a"], "--model_b", folders["a"], "--tokenizer", "byte"]
    argv = [*base, "--text", str(folders["root"] / "long.txt"), "--block_size", "128", "--out", str(tmp_path / "o")]
    line = error_line(command, argv, capsys)
    assert "`--block_size=128`" in line and "64 positions" in line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("text", ["empty.txt", "short.txt"])
def test_empty_or_short_text_names_text_and_block_size(folders, tmp_path, capsys, command, text):
    base = ["--model_a", folders["a"], "--model_b", folders["a"], "--tokenizer", "byte"]
    argv = [*base, "--text", str(folders["root"] / text), "--block_size", "32", "--out", str(tmp_path / "o")]
    line = error_line(command, argv, capsys)
    assert "--text" in line and (text == "empty.txt" or "--block_size=32" in line)


@pytest.mark.parametrize("command", COMMANDS)
def test_missing_model_names_the_commands_own_flag(folders, tmp_path, capsys, command):
    base = ["--model_a", folders["a"], "--model_b", str(tmp_path / "no_such_model"), "--tokenizer", "byte"]
    argv = [*base, "--text", str(folders["root"] / "long.txt"), "--block_size", "32", "--out", str(tmp_path / "o")]
    assert "`--model_b=" in error_line(command, argv, capsys)


@pytest.mark.parametrize("command", COMMANDS)
def test_models_reading_different_ids_are_refused(folders, tmp_path, capsys, command):
    base = ["--model_a", folders["a"], "--model_b", folders["b"], "--tokenizer", "byte"]
    argv = [*base, "--text", str(folders["root"] / "long.txt"), "--block_size", "32", "--out", str(tmp_path / "o")]
    line = error_line(command, argv, capsys)
    assert "`--model_b` reads 300 token ids, `--model_a` 260" in line
    assert not (tmp_path / "o").exists()
