"""`layerwise coupling`: prompts in, JSON and figures out; `--correlate` fits the regression of scores on coupling."""

import json

import numpy as np
import pytest
import torch
from tiny_models import tiny_config
from transformers import AutoModelForCausalLM

from layerwise.cli import main as cli_main
from layerwise.datamodules.tokenizers import load_tokenizer
from layerwise.features.jacobian import diagonal_jacobians, trace_blocks
from layerwise.metrics.functional_dynamics import coupling_score, depth_coupling

PROMPTS = ["Before we proceed any further, hear me speak.", "You are all resolved rather to die than to famish?"]


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> str:
    torch.manual_seed(0)
    config = tiny_config("gpt2", vocab_size=260)
    folder = str(tmp_path_factory.mktemp("gpt2"))
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


def test_coupling_command_writes_json_and_figures(model_folder, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"text": text}) + "\n" for text in PROMPTS))
    out = tmp_path / "out"
    argv = ["coupling", "--model", model_folder, "--tokenizer", "byte", "--prompts", str(prompts), "--ks", "2", "4"]
    cli_main([*argv, "--max_tokens", "12", "--device", "cpu", "--out", str(out)])
    record = json.loads((out / "coupling.json").read_text())
    assert record["num_prompts"] == 2 and record["ks"] == [2, 4] and record["model"] == model_folder
    model = AutoModelForCausalLM.from_pretrained(model_folder).eval()
    tokenizer = load_tokenizer("byte")
    matrices = []
    for text in PROMPTS:
        ids = tokenizer(text, return_tensors="pt", truncation=True, max_length=12)["input_ids"]
        trace = trace_blocks(model.transformer.h, lambda ids=ids: model(input_ids=ids, use_cache=False))
        matrices.append(depth_coupling(diagonal_jacobians(model.transformer.h, trace), (2, 4)))
    expected = torch.stack(matrices).mean(0)
    np.testing.assert_allclose(record["depth_coupling"], expected.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(record["coupling_score"], coupling_score(expected).numpy(), rtol=1e-6)
    assert record["token_coupling"]["blocks"] == [1, 3] and len(record["token_coupling"]["matrix"]) == 12
    for stem in ("coupling_depth", "coupling_spectra", "coupling_trajectory", "coupling_tokens", "coupling_pca"):
        assert (out / f"{stem}.png").stat().st_size > 1000
    printed = capsys.readouterr().out
    assert "coupling score over 2 prompts" in printed and str(out / "coupling.json") in printed


def test_coupling_command_errors_name_the_flag(model_folder, tmp_path, capsys):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    base = ["coupling", "--model", model_folder, "--tokenizer", "byte", "--device", "cpu"]
    for extra, flag in (
        (["--prompts", str(tmp_path / "missing.txt")], "--prompts"),
        (["--prompts", str(prompts), "--ks", "64"], "--ks"),
        (["--prompts", str(prompts), "--ks", "4", "--token_blocks", "1", "9"], "--token_blocks"),
    ):
        with pytest.raises(SystemExit):
            cli_main([*base, *extra, "--out", str(tmp_path / "never")])
        lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("layerwise coupling: error:")]
        assert len(lines) == 1 and flag in lines[0]
    assert not (tmp_path / "never").exists()  # refused before any Jacobian or file


def test_correlate_fits_the_regression(tmp_path, capsys):
    rows = ["name,coupling_json,accuracy"]
    scores = {"a": (-0.9, 0.51), "b": (-0.7, 0.60), "c": (-0.5, 0.72), "d": (-0.3, 0.79)}
    for name, (coupling, accuracy) in scores.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "coupling.json").write_text(json.dumps({"ks": [10, 30], "coupling_score": [coupling, 0.0]}))
        rows.append(f"{name},{name}/coupling.json,{accuracy}")
    table = tmp_path / "scores.csv"
    table.write_text("\n".join(rows) + "\n")
    cli_main(["coupling", "--correlate", str(table), "--k", "10", "--out", str(tmp_path / "fit")])
    fit = json.loads((tmp_path / "fit" / "correlation.json").read_text())
    x = np.array([value[0] for value in scores.values()])
    y = np.array([value[1] for value in scores.values()])
    slope, intercept = np.polyfit(x, y, 1)
    residual = y - (intercept + slope * x)
    assert fit["slope"] == pytest.approx(slope) and fit["intercept"] == pytest.approx(intercept)
    assert fit["r2"] == pytest.approx(1 - residual @ residual / ((y - y.mean()) @ (y - y.mean())))
    assert 0 < fit["p_value"] < 0.05 and fit["n"] == 4
    assert (tmp_path / "fit" / "correlation.png").stat().st_size > 1000
    assert "R²" in capsys.readouterr().out


def test_coupling_configs_parse_with_the_command_parser():
    from pathlib import Path

    from layerwise.cli.parser import command_parser
    from layerwise.commands.coupling import coupling

    root = Path(__file__).resolve().parents[2]
    for config in sorted((root / "configs" / "coupling").glob("*.yaml")):
        parsed = command_parser("coupling", coupling).parse_args(["--config", str(config)])
        assert parsed.model and (root / parsed.prompts).is_file() and max(parsed.ks) <= 512, config


def test_compare_and_stitch_configs_parse_with_their_command_parsers():
    from pathlib import Path

    from layerwise.cli.parser import command_parser
    from layerwise.commands.compare import compare
    from layerwise.commands.stitch import stitch

    root = Path(__file__).resolve().parents[2]
    commands = {
        "pythia_sizes.yaml": compare,
        "pythia_stitch.yaml": stitch,
        "gelu_vs_solu_cka.yaml": compare,
        "gelu_vs_solu_stitch.yaml": stitch,
        "feather_berts_stitch.yaml": stitch,
    }
    command_configs = [
        path for path in (root / "configs/compare").glob("*.yaml") if "class_path" not in path.read_text()
    ]
    assert sorted(path.name for path in command_configs) == sorted(commands)  # every command config is parsed here
    for name, function in commands.items():
        parsed = command_parser(function.__name__, function).parse_args(
            ["--config", str(root / "configs/compare" / name)]
        )
        if name.startswith("pythia"):
            assert parsed.model_a.startswith("EleutherAI/pythia") and parsed.dataset == "Salesforce/wikitext"
        elif name.startswith("gelu"):
            assert {parsed.model_a, parsed.model_b} == {
                "NeelNanda/SoLU_3L512W_C4_Code",
                "NeelNanda/GELU_3L512W_C4_Code",
            }
        else:
            assert (parsed.task, parsed.glue_task, parsed.hans, parsed.phi) == (
                "classification",
                "mnli",
                True,
                "identity",
            )


def test_coupling_prompts_from_a_dataset_folder(model_folder, tmp_path):
    folder = tmp_path / "prompts_dataset"
    folder.mkdir()
    rows = [{"text": text} for text in PROMPTS] + [{"text": "  "}]
    (folder / "validation.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    out = tmp_path / "out"
    cli_main(
        [
            "coupling",
            "--model",
            model_folder,
            "--tokenizer",
            "byte",
            "--dataset",
            str(folder),
            "--ks",
            "2",
            "--max_tokens",
            "12",
            "--device",
            "cpu",
            "--out",
            str(out),
        ]
    )
    record = json.loads((out / "coupling.json").read_text())
    assert record["num_prompts"] == 2 and record["prompts"].endswith(":validation:text")


def _prompts_file(tmp_path, texts) -> str:
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(texts) + "\n")
    return str(path)


def test_coupling_command_in_bfloat16_writes_results_and_figures(model_folder, tmp_path):
    out = tmp_path / "out"
    argv = ["coupling", "--model", model_folder, "--tokenizer", "byte", "--prompts", _prompts_file(tmp_path, PROMPTS)]
    cli_main([*argv, "--ks", "2", "--max_tokens", "8", "--dtype", "bfloat16", "--device", "cpu", "--out", str(out)])
    record = json.loads((out / "coupling.json").read_text())
    assert record["num_prompts"] == 2 and record["complete"] is True
    assert np.isfinite(np.asarray(record["depth_coupling"], dtype=float)).all()
    for stem in ("coupling_depth", "coupling_tokens", "coupling_pca"):
        assert (out / f"{stem}.png").stat().st_size > 1000


def test_coupling_crash_at_prompt_3_keeps_prompts_1_and_2(model_folder, tmp_path, monkeypatch):
    from layerwise.engines.coupling import CouplingAnalysis

    add, calls = CouplingAnalysis.add, []

    def failing_add(self, batch):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("CUDA out of memory (simulated)")
        add(self, batch)

    monkeypatch.setattr(CouplingAnalysis, "add", failing_add)
    out = tmp_path / "out"
    texts = [*PROMPTS, "A third prompt that will never finish."]
    argv = ["coupling", "--model", model_folder, "--tokenizer", "byte", "--prompts", _prompts_file(tmp_path, texts)]
    with pytest.raises(SystemExit):  # the CLI prints the error in one line
        cli_main([*argv, "--ks", "2", "--max_tokens", "8", "--device", "cpu", "--out", str(out)])
    record = json.loads((out / "coupling.json").read_text())
    assert record["num_prompts"] == 2 and record["complete"] is False
    model = AutoModelForCausalLM.from_pretrained(model_folder).eval()
    tokenizer = load_tokenizer("byte")
    matrices = []
    for text in PROMPTS:
        ids = tokenizer(text, return_tensors="pt", truncation=True, max_length=8)["input_ids"]
        trace = trace_blocks(model.transformer.h, lambda ids=ids: model(input_ids=ids, use_cache=False))
        matrices.append(depth_coupling(diagonal_jacobians(model.transformer.h, trace), (2,)))
    np.testing.assert_allclose(record["depth_coupling"], torch.stack(matrices).mean(0).numpy(), rtol=1e-6, atol=1e-6)


def _one_error_line(capsys) -> str:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("layerwise coupling: error:")]
    assert len(lines) == 1, lines
    return lines[0]


def test_coupling_checks_every_prompt_before_any_jacobian(model_folder, tmp_path, capsys, monkeypatch):
    from layerwise.engines.coupling import CouplingAnalysis

    def no_work(self, batch):
        raise AssertionError("a Jacobian was taken before every prompt was checked")

    monkeypatch.setattr(CouplingAnalysis, "add", no_work)
    texts = [*PROMPTS, "x"]  # the third prompt is one byte token
    argv = ["coupling", "--model", model_folder, "--tokenizer", "byte", "--prompts", _prompts_file(tmp_path, texts)]
    with pytest.raises(SystemExit):
        cli_main([*argv, "--ks", "2", "--device", "cpu", "--out", str(tmp_path / "never")])
    line = _one_error_line(capsys)
    assert "--prompts" in line and "prompt 3" in line
    assert not (tmp_path / "never").exists()


def test_a_token_index_past_a_prompt_is_refused_before_any_jacobian(model_folder, tmp_path, capsys, monkeypatch):
    from layerwise.engines.coupling import CouplingAnalysis

    def no_work(self, batch, counted=True):
        raise AssertionError("a Jacobian was taken before every prompt was checked")

    monkeypatch.setattr(CouplingAnalysis, "add", no_work)
    texts = [*PROMPTS, "short"]  # 5 byte tokens: --tokens 10 lies past it
    argv = ["coupling", "--model", model_folder, "--tokenizer", "byte", "--prompts", _prompts_file(tmp_path, texts)]
    with pytest.raises(SystemExit):
        cli_main([*argv, "--ks", "2", "--tokens", "10", "--device", "cpu", "--out", str(tmp_path / "never")])
    line = _one_error_line(capsys)
    assert "--tokens=10" in line and "prompt 3" in line and "5 tokens" in line
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize("tokenizer", [[], ["--tokenizer", "byte"]])
def test_coupling_missing_model_names_model(tmp_path, capsys, tokenizer):
    argv = ["coupling", "--model", str(tmp_path / "no_such_model"), *tokenizer]
    with pytest.raises(SystemExit):
        cli_main(
            [*argv, "--prompts", _prompts_file(tmp_path, PROMPTS), "--device", "cpu", "--out", str(tmp_path / "o")]
        )
    line = _one_error_line(capsys)
    assert "`--model=" in line and "--tokenizer" not in line and "model_name_or_path" not in line
    assert "config_overrides" not in line and "model_type" not in line


def test_depth_and_mis_coupling_refuse_k_above_width():
    from layerwise.metrics.functional_dynamics import mis_coupling

    jacobians = torch.randn(3, 4, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"K=5.*d=4"):
        depth_coupling(jacobians, (2, 5))
    with pytest.raises(ValueError, match=r"K=6.*d=4"):
        mis_coupling(jacobians[0], jacobians[1], 6)
    assert depth_coupling(jacobians, (4,)).shape == (1, 3, 3)
