"""The commands that run a model never write over an earlier run's results in ``--out``: one line, before any work.

Each command gets a model folder that is not there, so the test also shows the order: the refusal
naming ``--out`` comes before any model is loaded. ``--overwrite true`` replaces the results (``compare`` end to end).
"""

import json

import pytest
import torch
from tiny_models import tiny_config
from transformers import AutoModelForCausalLM

from layerwise.cli import main as cli_main

# command -> (its arguments but --out, the files it writes into --out that an earlier run left)
COMMANDS = {
    "compare": (["--model_a", "{model}", "--model_b", "{model}", "--text", "{text}"], ["compare.json"]),
    "stitch": (["--model_a", "{model}", "--model_b", "{model}", "--text", "{text}"], ["stitch.md"]),
    "coupling": (["--model", "{model}", "--prompts", "{text}"], ["coupling.json"]),
    "lens": (["--model", "{model}", "--prompt", "Once upon"], ["lens.md", "lens.png"]),
    "clip": (["--model", "{model}", "--data", "{root}"], ["clip_cross.png"]),
}


def error_line(command: str, argv: list, capsys) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli_main([command, *argv])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith(f"layerwise {command}: error:")]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.parametrize("command", COMMANDS)
def test_an_earlier_runs_results_stop_the_command_before_any_model_loads(tmp_path, capsys, command):
    (tmp_path / "corpus.txt").write_text("the quick brown fox jumps over the lazy dog.\n" * 50)
    argv, taken = COMMANDS[command]
    model = tmp_path / "no_such_model"  # a local path that is not there: refused at once, no network
    argv = [value.format(text=tmp_path / "corpus.txt", root=tmp_path, model=model) for value in argv]
    out = tmp_path / "out"
    out.mkdir()
    for name in taken:
        (out / name).write_text("an earlier run")
    line = error_line(command, [*argv, "--out", str(out)], capsys)
    assert f"`--out={out}` already holds {', '.join(taken)} from an earlier run" in line, line
    assert "--overwrite true" in line and "no_such_model" not in line
    assert sorted(path.name for path in out.iterdir()) == sorted(taken)
    assert all((out / name).read_text() == "an earlier run" for name in taken)
    # with --overwrite true the same command goes on, and now stops at the model it cannot load
    line = error_line(command, [*argv, "--out", str(out), "--overwrite", "true"], capsys)
    assert "no_such_model" in line and "already holds" not in line


def test_correlate_keeps_an_earlier_correlation(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "correlation.json").write_text("{}")
    (tmp_path / "scores.csv").write_text("coupling_json,score\n")
    line = error_line("coupling", ["--correlate", str(tmp_path / "scores.csv"), "--out", str(tmp_path / "out")], capsys)
    assert "already holds correlation.json" in line
    assert (tmp_path / "out" / "correlation.json").read_text() == "{}"


def test_compare_overwrites_only_when_asked(tmp_path, capsys):
    torch.manual_seed(0)
    config = tiny_config("gpt2", n_layer=2, n_embd=16, n_head=2, vocab_size=260)
    AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / "a")
    (tmp_path / "corpus.txt").write_text("the quick brown fox jumps over the lazy dog. " * 100)
    base = ["--model_a", str(tmp_path / "a"), "--model_b", str(tmp_path / "a"), "--tokenizer", "byte"]
    argv = [*base, "--text", str(tmp_path / "corpus.txt"), "--block_size", "32", "--device", "cpu"]
    out = tmp_path / "out"
    cli_main(["compare", *argv, "--out", str(out)])
    first = json.loads((out / "compare.json").read_text())
    assert first["pairs"] == "all"
    line = error_line("compare", [*argv, "--pairs", "diagonal", "--out", str(out)], capsys)
    assert "already holds compare.json, compare_cka.png" in line
    assert json.loads((out / "compare.json").read_text()) == first
    cli_main(["compare", *argv, "--pairs", "diagonal", "--out", str(out), "--overwrite", "true"])
    assert json.loads((out / "compare.json").read_text())["pairs"] == "diagonal"
