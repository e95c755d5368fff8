"""`layerwise compare` and `layerwise stitch` refuse bad options in one line naming their own flags, before work."""

import pytest
import torch
from tiny_models import tiny_config
from transformers import AutoModelForCausalLM

from layerwise.cli import main as cli_main

COMMANDS = {"compare": ["--device", "cpu"], "stitch": ["--accelerator", "cpu"]}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)
    out = {}
    for name, vocab in (("a", 260), ("b", 300), ("small", 50)):
        config = tiny_config("gpt2", n_layer=2, n_embd=16, n_head=2, vocab_size=vocab)
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


@pytest.mark.parametrize("command", COMMANDS)
def test_token_ids_past_the_models_embedding_are_refused(folders, tmp_path, capsys, command):
    """`byte` has 257 ids, these models read 50: one line naming --tokenizer, not an IndexError in the embedding."""
    base = ["--model_a", folders["small"], "--model_b", folders["small"], "--tokenizer", "byte"]
    argv = [*base, "--text", str(folders["root"] / "long.txt"), "--block_size", "32", "--out", str(tmp_path / "o")]
    line = error_line(command, argv, capsys)
    assert "`--tokenizer=byte` gives the text token id" in line and "`--model_a` reads ids below 50" in line, line
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("block_size", [0, 1])
def test_a_block_too_short_to_predict_is_refused_by_its_own_flag(folders, tmp_path, capsys, command, block_size):
    """stitch with --block_size 1 used to train, then die in a ZeroDivisionError (no next token to evaluate)."""
    base = ["--model_a", folders["a"], "--model_b", folders["a"], "--tokenizer", "byte", "--steps", "2"]
    base = base if command == "stitch" else base[:-2]
    argv = [*base, "--text", str(folders["root"] / "long.txt"), "--block_size", str(block_size)]
    line = error_line(command, [*argv, "--out", str(tmp_path / "o")], capsys)
    assert f"`--block_size={block_size}` must be >= 2" in line and "--text" not in line
    assert not (tmp_path / "o").exists()


def test_compare_names_the_one_option_out_of_range(folders, tmp_path, capsys):
    base = ["--model_a", folders["a"], "--model_b", folders["a"], "--tokenizer", "byte", "--text"]
    base += [str(folders["root"] / "long.txt"), "--out", str(tmp_path / "o")]
    assert "`--chunk=2` must be >= 4" in error_line("compare", [*base, "--chunk", "2"], capsys)
    assert "`--max_blocks=0` must be >= 1" in error_line("compare", [*base, "--max_blocks", "0"], capsys)


@pytest.mark.parametrize("command", COMMANDS)
def test_folder_slash_name_under_a_local_folder_is_a_missing_path_not_a_hub_id(
    folders, tmp_path, capsys, monkeypatch, command
):
    """``models/AA`` where ./models exists: refused at once, instead of ~20 s of offline hub retries."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    argv = ["--model_a", "models/AA", "--model_b", folders["a"], "--tokenizer", "byte"]
    argv += ["--text", str(folders["root"] / "long.txt"), "--block_size", "32", "--out", str(tmp_path / "o")]
    line = error_line(command, argv, capsys)
    assert "`--model_a=models/AA` does not exist" in line and "huggingface" not in line


def test_a_model_folder_without_a_tokenizer_points_at_the_tokenizer(folders, tmp_path, capsys):
    """The folders hold no tokenizer files: without --tokenizer, the default (model A's folder) is refused by name."""
    argv = ["--model_a", folders["a"], "--model_b", folders["a"], "--text", str(folders["root"] / "long.txt")]
    line = error_line("compare", [*argv, "--block_size", "32", "--out", str(tmp_path / "o")], capsys)
    assert f"--tokenizer={folders['a']!r} holds no tokenizer" in line and "--tokenizer=byte" in line, line


@pytest.mark.parametrize("offline", [True, False])
def test_a_hub_id_neither_cached_nor_reachable_is_refused_before_the_loader_retries(
    folders, tmp_path, capsys, monkeypatch, offline
):
    """Offline, the loader would retry the Hub for ~30 s; the command names the flag at once instead."""
    from layerwise import hub
    from layerwise.engines import checkpoint

    monkeypatch.setattr(hub, "hub_offline", lambda: offline)
    monkeypatch.setattr(hub, "hub_unreachable_reason", lambda url, timeout_s=None: "ConnectError: refused")
    loaded = []
    original = checkpoint.load_model
    monkeypatch.setattr(checkpoint, "load_model", lambda spec, *a, **k: loaded.append(spec) or original(spec, *a, **k))
    argv = ["--model_a", folders["a"], "--model_b", "layerwise-tests/never-cached", "--tokenizer", "byte"]
    argv += ["--text", str(folders["root"] / "long.txt"), "--block_size", "32", "--out", str(tmp_path / "o")]
    line = error_line("compare", argv, capsys)
    assert "`--model_b=layerwise-tests/never-cached` is neither a local folder nor in the Hugging Face cache" in line
    assert ("HF_HUB_OFFLINE" if offline else "ConnectError: refused") in line, line
    assert "layerwise-tests/never-cached" not in loaded and not (tmp_path / "o").exists()
