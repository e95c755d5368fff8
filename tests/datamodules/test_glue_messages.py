"""A GLUE file or Hub that cannot be read ends `layerwise fit` in one `error:` line (exit 2) naming the file and the
option, the traceback only with LAYERWISE_DEBUG=1: a bad label, a header only, the wrong columns, an empty file, an
unreachable Hub."""

import json
import socket

import pytest
from tiny_models import tiny_overrides

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

TINY_BERT = tiny_overrides(
    "bert", num_hidden_layers=2, hidden_size=16, num_attention_heads=2, intermediate_size=32, vocab_size=300,
    max_position_embeddings=512,  # BERT's default, which this test was written with
)  # fmt: skip
GLUE_CONFIG = f"""\
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
        config_overrides: {json.dumps(TINY_BERT)}
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

    from layerwise import hub

    def closed_port_url() -> str:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return f"http://127.0.0.1:{probe.getsockname()[1]}"

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "hub_endpoint", closed_port_url)
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
