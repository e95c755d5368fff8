"""A full disk (``ENOSPC``) or a vanished folder at each writer: no truncated file under a final name, one line.

The disk is made full by wrapping the file that :func:`layerwise.results.write_atomic` writes into: its first write
puts half of the bytes on disk, then raises ``OSError(ENOSPC)`` as the kernel does. Every file layerwise writes
goes through that function (summaries, figures, report, sweep/compare/stitch tables, exported models, saved
features, checkpoints), so a truncated file under the final name would show here. A figure that cannot be written
during a fit is warned once and the fit goes on; a checkpoint that cannot be written stops it with one line, and the
last complete checkpoint stays loadable.
"""

import contextlib
import errno
import io
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from layerwise.callbacks._loggers import _png_files
from layerwise.cli import LayerwiseCLI, main
from layerwise.engines.checkpoint import CheckpointReader
from layerwise.errors import LayerwiseWarning
from layerwise.results import (
    WriteError,
    merge_summary,
    save_figure_atomic,
    write_atomic,
    write_folder_atomic,
    write_text_atomic,
)

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="names a file descriptor's path through /proc")

QUICKSTART = str(Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml")
TINY = [
    "--model.init_args.backbone.init_args.embed_dim=16",
    "--model.init_args.backbone.init_args.depth=2",
    "--model.init_args.backbone.init_args.num_heads=2",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=1",
]
FULL = "No space left on device"


class FullFile:
    """A file on a full disk: the first write stores half of its bytes, then every write raises ENOSPC."""

    def __init__(self, file) -> None:
        self._file = file

    def write(self, data) -> int:
        self._file.write(bytes(data)[: max(1, len(data) // 2)])
        self._file.flush()
        raise OSError(errno.ENOSPC, FULL)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self._file.close()

    def __getattr__(self, name):
        return getattr(self._file, name)


def make_disk_full(monkeypatch, fails: Callable[[Path], bool]) -> None:
    """From now on, writing the file whose final path ``fails`` says hits a full disk."""
    real = os.fdopen

    def fdopen(fd, mode="r", *args, **kwargs):
        temporary = Path(os.readlink(f"/proc/self/fd/{fd}"))  # .<name>.<random>.tmp beside the final file
        file = real(fd, mode, *args, **kwargs)
        final = temporary.with_name(temporary.name[1:].rsplit(".", 2)[0])
        return FullFile(file) if "w" in mode and temporary.suffix == ".tmp" and fails(final) else file

    monkeypatch.setattr(os, "fdopen", fdopen)


@pytest.fixture
def full_disk(monkeypatch) -> Callable[[Callable[[Path], bool]], None]:
    """``full_disk(fails)``: :func:`make_disk_full` for one test."""
    return lambda fails: make_disk_full(monkeypatch, fails)


def only_final_files(folder: Path) -> list[str]:
    """Every file under ``folder``, failing on a temporary one left behind."""
    names = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert not [name for name in names if name.endswith(".tmp")], names
    return names


def a_figure():
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    figure = Figure(figsize=(2, 2))
    figure.add_subplot().plot([0, 1], [1, 0])
    return figure


# Each writer: (what it writes, how it is called with the final path).
WRITERS = {
    "summary": lambda path: merge_summary(path, {"epoch": 0, "accuracy": [0.5, 0.75]}, run_id="run"),
    "figure": lambda path: save_figure_atomic(path, a_figure()),
    "text (report, tables)": lambda path: write_text_atomic(path, "<html>" + "x" * 10_000 + "</html>"),
    "model (export, features)": lambda path: write_atomic(path, lambda file: torch.save(torch.nn.Linear(8, 8), file)),
    "checkpoint": lambda path: CheckpointReader().save_checkpoint({"epoch": 1, "w": torch.ones(64)}, path),
}
NAMES = {"summary": "val_epoch_001.json", "figure": "cos.png", "checkpoint": "last.ckpt"}


@pytest.mark.parametrize("writer", WRITERS)
def test_a_full_disk_leaves_no_file_under_the_final_name_and_says_so_in_one_line(tmp_path, full_disk, writer):
    path = tmp_path / "out" / NAMES.get(writer, "written.bin")
    full_disk(lambda final: final == path)
    with pytest.raises(WriteError) as error:
        WRITERS[writer](path)
    assert str(error.value) == f"could not write {path}: {FULL}." and error.value.errno == errno.ENOSPC
    assert only_final_files(tmp_path) == []


@pytest.mark.parametrize("writer", ["summary", "checkpoint"])
def test_a_full_disk_keeps_the_earlier_file_whole(tmp_path, full_disk, writer):
    path = tmp_path / NAMES[writer]
    WRITERS[writer](path)
    before = path.read_bytes()
    full_disk(lambda final: final == path)
    with pytest.raises(WriteError):
        WRITERS[writer](path)
    assert path.read_bytes() == before and only_final_files(tmp_path) == [path.name]


def test_a_folder_that_vanishes_while_written_is_named_with_the_cause(tmp_path):
    folder = tmp_path / "figures"
    path = folder / "cos.png"

    def vanish(file) -> None:
        file.write(b"half a figure")
        for child in folder.iterdir():
            child.unlink()
        folder.rmdir()

    with pytest.raises(WriteError, match=rf"^could not write {path}: No such file or directory\.$"):
        write_atomic(path, vanish)
    assert not folder.exists()


def test_a_folder_written_on_a_full_disk_is_not_left_half_written(tmp_path):
    folder = tmp_path / "hf_depth_2"  # export's save_pretrained folder, a tokenizer's folder

    def save_pretrained(staging: Path) -> None:
        staging.mkdir()
        (staging / "config.json").write_text("{}")
        raise OSError(errno.ENOSPC, FULL)

    with pytest.raises(WriteError, match=rf"^could not write {folder}: {FULL}\.$"):
        write_folder_atomic(folder, save_pretrained)
    assert list(tmp_path.iterdir()) == []


def test_a_figure_file_that_cannot_be_written_is_warned_once_and_skipped(tmp_path, full_disk):
    sink = _png_files(str(tmp_path))
    full_disk(lambda final: final.suffix == ".png")
    image = np.zeros((4, 4, 3), dtype=np.uint8)
    with pytest.warns(LayerwiseWarning) as caught:
        sink.log("layerwise val/cos", image, 3)
        sink.log("layerwise val/cka", image, 3)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert f"could not write {tmp_path}/layerwise/images/layerwise_val/cos_step_0000003.png: {FULL}." in message
    assert "The run goes on" in message
    assert only_final_files(tmp_path) == []


def fit(save_dir: Path, *extra: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        LayerwiseCLI(
            args=[
                "fit",
                "--config",
                QUICKSTART,
                *TINY,
                "--trainer.logger=CSVLogger",
                f"--trainer.logger.init_args.save_dir={save_dir}",
                *extra,
            ]
        )
    return out.getvalue()


@pytest.fixture(scope="module")
def figureless_run(tmp_path_factory) -> tuple[Path, str, list]:
    """A 2-epoch fit whose figure files (drawn at its last epoch) all meet a full disk: its folder, output, warnings."""
    save_dir = tmp_path_factory.mktemp("runs")
    with pytest.MonkeyPatch.context() as monkeypatch, pytest.warns(LayerwiseWarning) as caught:
        make_disk_full(monkeypatch, lambda final: final.suffix == ".png")
        output = fit(save_dir, "--trainer.max_epochs=2")
    return save_dir / "quickstart" / "version_0", output, [w for w in caught if w.category is LayerwiseWarning]


def test_a_fit_goes_on_when_only_its_figures_cannot_be_written(figureless_run):
    run, output, caught = figureless_run
    assert len(caught) == 1 and FULL in str(caught[0].message), [str(w.message) for w in caught]
    assert output.strip().splitlines()[-1].startswith("layerwise fit: 2 epochs, step 4; ")
    files = only_final_files(run)
    assert not [name for name in files if name.endswith(".png")]
    assert {"layerwise/val_epoch_000_step_0000002.json", "layerwise/val_epoch_001_step_0000004.json"} <= set(files)


@pytest.mark.parametrize("command", ["plot", "report", "sweep"])
def test_a_command_on_a_full_disk_ends_in_one_line_naming_a_file(figureless_run, full_disk, tmp_path, capsys, command):
    run, _, _ = figureless_run
    out = tmp_path / ("report.html" if command == "report" else "out")
    full_disk(lambda final: True)
    with pytest.raises(SystemExit) as exit_info:
        main([command, str(run), "--out", str(out), *(["--format", "png"] if command != "report" else [])])
    errors = capsys.readouterr().err.strip().splitlines()
    assert exit_info.value.code == 1
    assert len(errors) == 1 and errors[0].startswith(f"layerwise {command}: error: could not write {out}"), errors
    assert errors[0].endswith(f": {FULL}."), errors
    assert only_final_files(tmp_path) == []


def test_a_checkpoint_that_cannot_be_written_stops_the_fit_in_one_line_and_keeps_the_last_one(
    tmp_path, full_disk, capsys
):
    written = []

    def second_epoch(final: Path) -> bool:  # the first epoch writes epoch=0-step=2.ckpt and last.ckpt, then full
        written.extend([final.name] if final.suffix == ".ckpt" else [])
        return len(written) > 2

    full_disk(second_epoch)
    with pytest.raises(SystemExit) as exit_info:
        fit(tmp_path, "--trainer.max_epochs=3")
    stderr = capsys.readouterr().err
    errors = [line for line in stderr.splitlines() if "error" in line.lower()]
    assert "Traceback" not in stderr and stderr.strip().splitlines()[-1] == errors[-1], stderr[-3000:]
    checkpoints = tmp_path / "quickstart" / "version_0" / "checkpoints"
    assert exit_info.value.code == 1
    assert errors == [f"layerwise fit: error: could not write {checkpoints / 'last.ckpt'}: {FULL}."]
    assert only_final_files(checkpoints) == ["epoch=0-step=2.ckpt", "last.ckpt"]
    last = torch.load(checkpoints / "last.ckpt", map_location="cpu", weights_only=True)
    assert (last["epoch"], last["global_step"]) == (0, 2)  # the last complete checkpoint, whole and loadable
    summaries = sorted(p.name for p in (checkpoints.parent / "layerwise").glob("*.json"))
    assert json.loads((checkpoints.parent / "layerwise" / summaries[0]).read_text())["epoch"] == 0


def test_a_sharded_checkpoints_meta_on_a_full_disk_keeps_the_earlier_one_whole(tmp_path, full_disk):
    """FSDP2's checkpoint folder (Lightning's ModelParallelStrategy, as a LayerwiseModule sets it up): its ``meta.pt``
    (epoch, step, loops, callbacks) is written atomically; shards are torch.distributed.checkpoint's."""
    from lightning.pytorch.strategies import ModelParallelStrategy

    from layerwise.engines.checkpoint import LIGHTNING_META, save_sharded

    strategy = ModelParallelStrategy()  # one process, no process group: broadcast is the identity
    folder = tmp_path / "last.ckpt"

    def save(step: int) -> None:
        checkpoint = {"state_dict": {"w": torch.full((64,), step)}, "optimizer_states": [], "global_step": step}
        save_sharded(strategy, checkpoint, folder)

    save(3)
    before = (folder / LIGHTNING_META).read_bytes()
    full_disk(lambda final: final.name == LIGHTNING_META)
    with pytest.raises(WriteError, match=rf"^could not write {folder / LIGHTNING_META}: {FULL}\.$"):
        save(6)
    assert (folder / LIGHTNING_META).read_bytes() == before and LIGHTNING_META in only_final_files(folder)
    assert torch.load(folder / LIGHTNING_META, weights_only=True) == {"global_step": 3}


def test_lightning_clis_config_yaml_on_a_full_disk_is_not_left_truncated(tmp_path, full_disk, capsys):
    """``config.yaml`` (LightningCLI's SaveConfigCallback, here ``KeptConfig``) goes through the atomic writer: a full
    disk ends the fit before it trains, in one line naming the file, with no config.yaml under its name."""
    full_disk(lambda final: final.name == "config.yaml")
    with pytest.raises(SystemExit) as exit_info:
        fit(tmp_path, "--trainer.max_epochs=1")
    stderr = capsys.readouterr().err
    run = tmp_path / "quickstart" / "version_0"
    assert exit_info.value.code == 1 and "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == f"layerwise fit: error: could not write {run / 'config.yaml'}: {FULL}."
    assert "config.yaml" not in only_final_files(tmp_path / "quickstart")


def test_the_config_yaml_written_atomically_is_what_lightning_writes(tmp_path):
    """``KeptConfig`` writes the bytes Lightning's own ``SaveConfigCallback`` writes, and moves an earlier one aside."""
    from lightning.pytorch.cli import SaveConfigCallback

    from layerwise.cli.runs import KeptConfig

    no_logger = ["--trainer.logger=false", f"--trainer.default_root_dir={tmp_path}"]  # the log folder: this one
    cli = LayerwiseCLI(args=["--config", QUICKSTART, *TINY, *no_logger], run=False)
    ours = next(callback for callback in cli.trainer.callbacks if isinstance(callback, KeptConfig))
    lightnings = SaveConfigCallback(cli.parser, cli.config, config_filename="lightning.yaml", overwrite=True)
    (tmp_path / "config.yaml").write_text("an earlier run's\n")
    with pytest.warns(LayerwiseWarning, match="held the config of an earlier run"):
        ours.setup(cli.trainer, cli.model, "fit")
    lightnings.setup(cli.trainer, cli.model, "fit")
    assert (tmp_path / "config.yaml").read_text() == (tmp_path / "lightning.yaml").read_text()
    (aside,) = tmp_path.glob("config.yaml.earlier-*")
    assert aside.read_text() == "an earlier run's\n" and only_final_files(tmp_path)
