"""What a command prints besides its results: a DDP fit's console without upstream noise (no advice to sync values
already reduced, no uncounted FLOPs, one arrow, each summary path once, the head's parameter line on stdout), and
`layerwise lens` without transformers' generation-flag warning.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def run_python(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)


@pytest.fixture(scope="module")
def ddp_fit(tmp_path_factory):
    """The quickstart for one batch on 2 gloo processes, through `python -m layerwise` as a user runs it."""
    root = tmp_path_factory.mktemp("ddp")
    result = run_python(
        "-m",
        "layerwise",
        "fit",
        "--config",
        "configs/quickstart.yaml",
        "--trainer.devices=2",
        "--trainer.strategy=ddp_fork",
        "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=1",
        "--trainer.limit_val_batches=1",
        f"--trainer.logger.init_args.save_dir={root}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_a_ddp_fit_does_not_ask_for_sync_dist_on_values_already_reduced(ddp_fit):
    assert "layerwise validation, epoch 0" in ddp_fit.stdout  # the callbacks ran (their table is there)
    assert "sync_dist=True" not in ddp_fit.stderr, ddp_fit.stderr[-3000:]


def test_the_head_parameter_line_is_on_stdout_with_the_tables(ddp_fit):
    assert "one shared head has" in ddp_fit.stdout and "one shared head has" not in ddp_fit.stderr
    assert ddp_fit.stdout.count("one shared head has") == 1  # once, from global rank zero


def test_the_model_summary_shows_no_flops_it_did_not_count(ddp_fit):
    assert "Trainable params" in ddp_fit.stdout and "Total params" in ddp_fit.stdout  # the summary is printed
    console = ddp_fit.stdout + ddp_fit.stderr
    assert "FLOPs" not in console and "Total Flops" not in console, ddp_fit.stdout[:3000]


def test_counted_flops_keep_lightnings_summary(capsys):
    from layerwise.cli.summary import CountedModelSummary

    data = [(" ", ["0"]), ("Name", ["net"]), ("Type", ["Linear"]), ("Params", ["20"]), ("Mode", ["train"])]
    CountedModelSummary.summarize([*data, ("FLOPs", ["0"])], 20, 20, 0.0, {"train": 1, "eval": 0}, total_flops=0)
    without = capsys.readouterr().out
    assert "net" in without and "Linear" in without and "20" in without and "FLOPs" not in without, without
    CountedModelSummary.summarize([*data, ("FLOPs", ["1.2 K"])], 20, 20, 0.0, {"train": 1, "eval": 0}, total_flops=1200)
    counted = capsys.readouterr()
    assert "1.2 K" in counted.out + counted.err, counted


def test_the_console_uses_one_arrow(ddp_fit):
    assert not ("→" in ddp_fit.stdout and "->" in ddp_fit.stdout), ddp_fit.stdout[-3000:]


def test_the_summary_path_is_printed_once_per_validation(ddp_fit):
    summaries = [word for word in ddp_fit.stdout.split() if word.endswith(".json")]
    assert summaries and len(summaries) == len(set(summaries)), ddp_fit.stdout[-3000:]


def test_lens_prints_no_transformers_generation_flag_warning(tmp_path):
    from tiny_models import tiny_config
    from transformers import GPT2LMHeadModel

    torch.manual_seed(0)
    config = tiny_config("gpt2", n_layer=2, n_embd=16, n_head=2, vocab_size=257, n_positions=32)
    config.bos_token_id = config.eos_token_id = 256  # the byte tokenizer's one special token
    GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt")
    result = run_python(
        "-m", "layerwise", "lens", "--model", str(tmp_path / "gpt"), "--tokenizer", "byte",
        "--tokenizer_dir", str(tmp_path / "tok"), "--prompt", "hello", "--max_new_tokens", "2",
        "--out", str(tmp_path / "lens"),
    )  # fmt: skip
    assert result.returncode == 0 and (tmp_path / "lens" / "lens.md").exists(), result.stderr[-3000:]
    assert "top_k" not in result.stderr, result.stderr[-3000:]
