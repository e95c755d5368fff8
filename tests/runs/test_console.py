"""Issue 23: the package's own checks end a `layerwise` command in one `error:` line (exit 2), the traceback only with
LAYERWISE_DEBUG=1 — a GLUE file with a bad label, a header only, the wrong columns or nothing at all, and a model
whose hooked blocks have different widths (point 2); and the console of a fit without upstream noise (point 15)."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from torch import nn

from layerwise.cli import LayerwiseCLI
from layerwise.errors import UsageError

QUIET = [
    "--trainer.accelerator=cpu",
    "--trainer.devices=1",
    "--trainer.max_epochs=1",
    "--trainer.limit_train_batches=1",
    "--trainer.limit_val_batches=1",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--trainer.enable_checkpointing=false",
]

GLUE_CONFIG = """\
seed_everything: 0
trainer:
  logger: false
model:
  class_path: layerwise.lightning_modules.Standard
  init_args:
    backbone:
      class_path: layerwise.features.HFEncoder
      init_args:
        model_type: bert
        num_classes: 2
        config_overrides: {hidden_size: 16, num_hidden_layers: 2, num_attention_heads: 2, intermediate_size: 32,
                           vocab_size: 300}
data:
  class_path: layerwise.datamodules.GLUEDataModule
  init_args:
    task: sst2
    tokenizer: byte
    max_length: 16
    batch_size: 2
"""

DEV = "sentence\tlabel\na good film\t1\na bad film\t0\n"


def one_line(capsys, exit_info) -> str:
    """Exit code 2, one `error:` line, no traceback."""
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def glue_fit(tmp_path, train: str) -> list[str]:
    """The arguments of a tiny BERT fit on an SST-2 folder whose train.tsv is ``train``."""
    folder = tmp_path / "sst2"
    folder.mkdir(exist_ok=True)
    (folder / "train.tsv").write_text(train, encoding="utf-8")
    (folder / "dev.tsv").write_text(DEV, encoding="utf-8")
    (tmp_path / "glue.yaml").write_text(GLUE_CONFIG)
    return [
        "fit",
        "--config",
        str(tmp_path / "glue.yaml"),
        *QUIET,
        f"--data.init_args.data_dir={folder}",
        f"--data.init_args.tokenizer_dir={tmp_path / 'tok'}",
        f"--trainer.default_root_dir={tmp_path}",
    ]


@pytest.mark.parametrize(
    ("train", "cause"),
    [
        ("sentence\tlabel\na good film\t1\na bad film\tmaybe\n", "train.tsv, row 2: unknown sst2 label 'maybe'"),
        ("sentence\tlabel\n", "train.tsv has a header but no rows"),
        ("text\tlabel\na good film\t1\n", "train.tsv lacks the sst2 text column(s)"),
        ("", "train.tsv is empty"),
    ],
    ids=["bad-label", "header-only", "wrong-columns", "empty"],
)
def test_a_bad_glue_file_ends_in_one_line_naming_the_file_and_the_option(tmp_path, capsys, monkeypatch, train, cause):
    args = glue_fit(tmp_path, train)
    with pytest.raises(SystemExit) as exit_info:
        LayerwiseCLI(args=args)
    line = one_line(capsys, exit_info)
    assert line.startswith(f"layerwise fit: error: `--data.init_args.data_dir={tmp_path / 'sst2'}`: "), line
    assert cause in line, line
    monkeypatch.setenv("LAYERWISE_DEBUG", "1")
    with pytest.raises(UsageError, match=cause.replace("(", r"\(").replace(")", r"\)")):
        LayerwiseCLI(args=args)


def test_an_unreachable_hub_ends_in_one_line_naming_the_option(tmp_path, capsys, monkeypatch):
    import datasets

    from layerwise.datamodules import _hub

    def closed_port_url() -> str:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return f"http://127.0.0.1:{probe.getsockname()[1]}"

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(_hub, "hub_endpoint", closed_port_url)
    (tmp_path / "glue.yaml").write_text(GLUE_CONFIG)
    args = ["fit", "--config", str(tmp_path / "glue.yaml"), *QUIET, f"--trainer.default_root_dir={tmp_path}"]
    with pytest.raises(SystemExit) as exit_info:
        LayerwiseCLI(args=args)
    line = one_line(capsys, exit_info)
    assert line.startswith("layerwise fit: error: Cannot reach the Hugging Face Hub at http://127.0.0.1:"), line
    assert "`--data.init_args.data_dir=/path/to/SST-2`" in line, line
    monkeypatch.setenv("LAYERWISE_DEBUG", "1")
    with pytest.raises(ConnectionError, match="Cannot reach the Hugging Face Hub"):
        LayerwiseCLI(args=args)


# ------------------------------------------------------------------------------ hooked blocks of different widths


class Residual(nn.Module):
    def __init__(self, dim_in: int, dim_out: int):
        super().__init__()
        self.fc = nn.Linear(dim_in, dim_out)

    def forward(self, x):
        return self.fc(x) + (x if x.shape[-1] == self.fc.out_features else 0)


class WideningModel(LightningModule):
    """Digits as 8 tokens of width 8 -> blocks of widths 8, 12, 12 -> first token -> LayerNorm -> Linear."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Residual(8, 8), Residual(8, 12), Residual(12, 12)])
        self.norm = nn.LayerNorm(12)
        self.fc = nn.Linear(12, 10)

    def forward(self, images):
        x = images.reshape(len(images), 8, 8)
        for block in self.blocks:
            x = block(x)
        return self.fc(self.norm(x[:, 0]))

    def training_step(self, batch, batch_idx):
        images, labels = batch
        return F.cross_entropy(self(images), labels)

    def validation_step(self, batch, batch_idx):
        images, labels = batch
        self.log("val/loss", F.cross_entropy(self(images), labels))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def test_hooked_blocks_of_different_widths_end_in_one_line_naming_the_option(tmp_path, capsys, monkeypatch):
    args = [
        "validate",
        "--model=test_console.WideningModel",
        "--data=layerwise.datamodules.DigitsDataModule",
        *QUIET,
        "--trainer.logger=false",
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.callbacks+=layerwise.callbacks.LayerwiseAnalysis",
        "--trainer.callbacks.blocks=blocks",
        "--trainer.callbacks.final_norm=norm",
        "--trainer.callbacks.classifier=fc",
        "--trainer.callbacks.log_figures=false",
    ]
    with pytest.raises(SystemExit) as exit_info:
        LayerwiseCLI(args=args)
    line = one_line(capsys, exit_info)
    assert line.startswith("layerwise validate: error: `blocks=blocks`: "), line
    assert "block 1 returns features of width 8, block 2 of width 12" in line, line
    monkeypatch.setenv("LAYERWISE_DEBUG", "1")
    with pytest.raises(UsageError, match="different widths"):  # a run of its own folder: the first one's config stays
        LayerwiseCLI(args=[*args, f"--trainer.default_root_dir={tmp_path / 'debug'}"])


# ------------------------------------------------------------------------------ 15: the console of a run, no noise

ROOT = Path(__file__).resolve().parents[2]


def run_python(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)


def test_the_first_block_jacobian_prints_no_torch_jit_script_deprecation():
    """torch builds its JVP decompositions with its own torch.jit.script on a process's first forward-mode AD."""
    code = (
        "import warnings, torch\n"
        "warnings.simplefilter('always')\n"
        "from layerwise.features.jacobian import trace_blocks, diagonal_jacobians\n"
        "blocks = torch.nn.ModuleList([torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)])\n"
        "def run():\n"
        "    x = torch.randn(1, 3, 4)\n"
        "    for block in blocks:\n"
        "        x = x + block(x)\n"
        "trace = trace_blocks(blocks, run)\n"
        "print('SHAPE', tuple(diagonal_jacobians(blocks, trace).shape))\n"
    )
    result = run_python("-c", code)
    assert "SHAPE (2, 4, 4)" in result.stdout, result.stderr[-3000:]
    assert "jit.script" not in result.stderr, result.stderr[-3000:]


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
    assert "layerwise val (epoch 0" in ddp_fit.stdout  # the callbacks ran (their table is there)
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
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=257, n_positions=32)
    config.bos_token_id = config.eos_token_id = 256  # the byte tokenizer's one special token
    GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt")
    result = run_python(
        "-m", "layerwise", "lens", "--model", str(tmp_path / "gpt"), "--tokenizer", "byte",
        "--tokenizer_dir", str(tmp_path / "tok"), "--prompt", "hello", "--max_new_tokens", "2",
        "--out", str(tmp_path / "lens"),
    )  # fmt: skip
    assert result.returncode == 0 and (tmp_path / "lens" / "lens.md").exists(), result.stderr[-3000:]
    assert "top_k" not in result.stderr, result.stderr[-3000:]


def test_a_model_outside_the_table_without_paths_ends_in_one_line(tmp_path, capsys):
    args = [
        "validate",
        "--model=test_console.WideningModel",
        "--data=layerwise.datamodules.DigitsDataModule",
        *QUIET,
        "--trainer.logger=false",
        f"--trainer.default_root_dir={tmp_path}",
        "--trainer.callbacks+=layerwise.callbacks.LayerwiseAnalysis",
        "--trainer.callbacks.log_figures=false",
    ]
    with pytest.raises(SystemExit) as exit_info:
        LayerwiseCLI(args=args)
    line = one_line(capsys, exit_info)
    assert "layerwise found no model of a known family" in line and "`blocks=" in line, line
