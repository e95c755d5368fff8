"""The CLI's one-line errors name the option and the innermost cause; the package's own checks end in one
line (exit 2) in the LightningCLI commands too, with the traceback on demand (LAYERWISE_DEBUG=1); a bug keeps its
traceback; ``layerwise --help`` answers without importing Lightning."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from lightning.pytorch import Callback

from layerwise.cli import LayerwiseCLI, main
from layerwise.cli.app import COMMANDS, TRAINER_COMMANDS, command_function
from layerwise.cli.errors import concise_error
from layerwise.errors import UsageError

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "configs" / "quickstart.yaml")
QUIET = ["--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def quickstart(tmp_path, *overrides, command="fit"):
    return LayerwiseCLI(
        args=[
            command,
            "--config",
            QUICKSTART,
            f"--trainer.logger.init_args.save_dir={tmp_path}",
            "--trainer.max_epochs=1",
            "--trainer.limit_train_batches=1",
            "--trainer.limit_val_batches=1",
            *QUIET,
            *overrides,
        ]
    )


def one_line(capsys, exit_info) -> str:
    """Exit code 2, one `error:` line, no traceback and no jsonargparse dump."""
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and "Traceback" not in err and "Given value" not in err, err
    return lines[0]


# ------------------------------------------------------------------------------ 1: the innermost cause, named


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["compare", "--model_a", "a", "--model_b", "b", "--precision", "fsat"], "--precision: Expected a typing.Lit"),
        (["plot", "runs", "--nope"], "unrecognized arguments: --nope"),
        (["sweep"], "the following arguments are required: runs"),
    ],
)
def test_a_commands_bad_option_is_one_line_without_the_usage_block(capsys, argv, expected):
    """The commands built from functions (`compare`, `plot`, ...) answer like fit: one line, not argparse's usage."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "usage:" not in err, err
    lines = [line for line in err.splitlines() if "error:" in line]
    assert len(lines) == 1 and lines[0].startswith(f"layerwise {argv[0]}: error: ") and expected in lines[0], err


def test_a_missing_config_file_says_so(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", "configs/quickstrat.yaml"])
    line = one_line(capsys, exit_info)
    assert "--config: File does not exist" in line and "quickstrat.yaml" in line, line


@pytest.mark.parametrize(
    ("override", "option", "cause"),
    [
        (
            "--model.class_path=layerwise.lightning_modules.AlternatingAligend",
            "--model=layerwise.lightning_modules.AlternatingAligend",
            "has no attribute 'AlternatingAligend'",
        ),
        (
            "--model.init_args.x=1",
            "--model=layerwise.lightning_modules.AlternatingAligned",
            "Option 'x' is not accepted",
        ),
        (
            "--model.init_args.backbone.init_args.x=1",
            "--model.init_args.backbone=layerwise.features.TimmViT",
            "Option 'x' is not accepted",
        ),
        (  # the constructor's own error, raised when the classes are instantiated
            "--model.init_args.backbone.init_args.num_heads=5",
            "--model.init_args.backbone=layerwise.features.TimmViT",
            "dim should be divisible by num_heads",
        ),
    ],
)
def test_a_nested_error_names_the_option_and_the_innermost_cause(tmp_path, capsys, override, option, cause):
    with pytest.raises(SystemExit) as exit_info:
        quickstart(tmp_path, override)
    line = one_line(capsys, exit_info)
    assert option in line and cause in line, line
    assert not line.rstrip().endswith(":"), line


@pytest.mark.parametrize(
    "option, value, moved",
    [("thresholds", "[0.5, 0.9]", "logit_lens: {thresholds: [...]}"), ("nc1_top_classes", "100", "neural_collapse")],
)
def test_an_option_layerwise_analysis_took_until_0_2_says_where_it_went(tmp_path, capsys, option, value, moved):
    config = tmp_path / "old.yaml"
    config.write_text(
        "trainer:\n  callbacks:\n    - class_path: layerwise.callbacks.LayerwiseAnalysis\n"
        f"      init_args:\n        {option}: {value}\n"
    )
    with pytest.raises(SystemExit) as exit_info:
        quickstart(tmp_path, "--config", str(config))
    line = one_line(capsys, exit_info)
    assert f"LayerwiseAnalysis: Option '{option}' is not accepted; it moved: {moved}" in line


def test_a_missing_required_backbone_is_named(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--model.class_path=layerwise.lightning_modules.AlternatingAligned"])
    line = one_line(capsys, exit_info)
    assert "--model=layerwise.lightning_modules.AlternatingAligned" in line and "required: backbone" in line, line


def test_concise_error_takes_the_deepest_line_and_builds_the_option():
    message = """Parser key "model":
  Does not validate against any of the Union subtypes
  Errors:
    - Problem with given class_path 'a.B':
        Parser key "backbone":
          Problem with given class_path 'a.C':
            Parser key "pooling":
              Expected a typing.Literal['cls']. Got value: max
    - Expected a <class 'NoneType'>
  Given value: NestedArg(key='backbone.init_args.pooling', val='max')"""
    assert concise_error(message) == (
        "--model.init_args.backbone.init_args.pooling: Expected a typing.Literal['cls']. Got value: max"
    )


UNION_OF_A_LIST = """Does not validate against any of the Union subtypes
Subtypes: [<class 'lightning.pytorch.loggers.logger.Logger'>, collections.abc.Iterable[Logger], <class 'bool'>]
Errors:
  - Not a valid subclass of Logger. Got value: [Namespace(class_path='lightning.pytorch.loggers.TensorBoardLogger')]
    Subclass types expect one of:
    - a class path (str)
    - a dict with class_path entry
    - a dict without class_path but with init_args entry (class path given previously)
    - a dict with parameters accepted by the base class (implicit class_path)
  - The filesystem tracking backend (e.g., './mlruns') is in maintenance mode. Set `MLFLOW_ALLOW_FILE_STORE=true`.
  - Expected a <class 'bool'>
  - Expected a <class 'NoneType'>
Given value type: <class 'list'>
Given value: [<TensorBoardLogger object at 0x7f>, Namespace(class_path='lightning.pytorch.loggers.MLFlowLogger')]"""


def test_concise_error_of_a_list_of_classes_is_the_failing_class_s_own_message():
    """jsonargparse's generic union lines ("a class path (str)") are never the cause while the real one is there."""
    cause = (
        "The filesystem tracking backend (e.g., './mlruns') is in maintenance mode. Set `MLFLOW_ALLOW_FILE_STORE=true`."
    )
    logger = "lightning.pytorch.loggers.MLFlowLogger"
    assert concise_error(UNION_OF_A_LIST) == f"class_path '{logger}': {cause}"
    assert concise_error(UNION_OF_A_LIST, {logger: "trainer.logger"}) == f"--trainer.logger={logger}: {cause}"


def test_concise_error_of_a_class_that_is_not_a_subclass_says_so_not_the_forms_a_class_takes():
    message = "\n".join(line for line in UNION_OF_A_LIST.splitlines() if "filesystem tracking backend" not in line)
    assert concise_error(message).startswith("Not a valid subclass of Logger.")


def test_a_logger_in_a_list_that_refuses_its_arguments_is_named_in_one_line(tmp_path, capsys, monkeypatch):
    """MLflow 3 refuses its file store: the line names --trainer.logger, the class and MLflow's own reason."""
    pytest.importorskip("mlflow", reason="mlflow-skinny is absent (pip install -e '.[loggers]')")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    monkeypatch.chdir(tmp_path)
    loggers = tmp_path / "loggers.yaml"
    loggers.write_text(
        "trainer:\n  logger:\n"
        "    - class_path: lightning.pytorch.loggers.TensorBoardLogger\n      init_args: {save_dir: runs}\n"
        "    - class_path: lightning.pytorch.loggers.MLFlowLogger\n      init_args: {tracking_uri: 'file:./mlruns'}\n"
    )
    with pytest.raises(SystemExit) as exit_info:
        quickstart(tmp_path, "--config", str(loggers))
    line = one_line(capsys, exit_info)
    assert line.startswith("layerwise fit: error: --trainer.logger=lightning.pytorch.loggers.MLFlowLogger: "), line
    assert "MLFLOW_ALLOW_FILE_STORE=true" in line and "a class path" not in line
    assert not (tmp_path / "runs").exists()


# ------------------------------------------------------------------------------ 2: the package's own checks


LAYERS_7 = """trainer:
  callbacks:
    - class_path: layerwise.callbacks.LayerwiseAnalysis
      init_args:
        layers: 7
"""


def test_layers_beyond_the_model_end_in_one_line_and_a_traceback_on_demand(tmp_path, capsys, monkeypatch):
    config = tmp_path / "layers.yaml"
    config.write_text(LAYERS_7)
    with pytest.raises(SystemExit) as exit_info:
        quickstart(tmp_path, "--config", str(config))
    line = one_line(capsys, exit_info)
    assert line.startswith("layerwise fit: error: LayerwiseAnalysis: `layers=7`") and "6-layer model" in line, line
    assert not any(tmp_path.rglob("*.ckpt"))
    monkeypatch.setenv("LAYERWISE_DEBUG", "1")
    with pytest.raises(UsageError, match="layers=7"):
        quickstart(tmp_path, "--config", str(config))


@pytest.mark.parametrize("command", ["validate", "test"])
def test_a_ckpt_path_that_does_not_exist_ends_in_one_line(tmp_path, capsys, monkeypatch, command):
    missing = tmp_path / "nope.ckpt"
    with pytest.raises(SystemExit) as exit_info:
        quickstart(tmp_path, f"--ckpt_path={missing}", command=command)
    line = one_line(capsys, exit_info)
    assert line == f"layerwise {command}: error: `--ckpt_path={missing}`: no such file.", line
    monkeypatch.setenv("LAYERWISE_DEBUG", "1")
    with pytest.raises(UsageError, match="no such file"):
        quickstart(tmp_path, f"--ckpt_path={missing}", command=command)


class Boom(Callback):
    """A bug: an exception the package did not raise on purpose."""

    def setup(self, trainer, pl_module, stage):
        raise RuntimeError("a bug in a callback")


def test_a_bug_keeps_its_traceback(tmp_path):
    with pytest.raises(RuntimeError, match="a bug in a callback"):
        quickstart(tmp_path, "--trainer.callbacks+=test_cli_messages.Boom")


def test_a_usage_error_from_the_package_is_a_value_error():
    from layerwise.features import select_layers

    with pytest.raises(UsageError, match="`layers=7` asks for the last 7 layers of a 2-layer model"):
        select_layers(7, 2)
    assert issubclass(UsageError, ValueError)


# ------------------------------------------------------------------------------ 14: --help without Lightning


def run_python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "2"}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


@pytest.mark.parametrize("argv", [["--help"], ["plot", "--help"], ["report", "--help"]])
def test_help_imports_neither_lightning_nor_the_other_commands(argv):
    code = (
        f"import sys\nfrom layerwise.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        "heavy = sorted(m for m in ('lightning', 'torch', 'transformers', 'timm', 'layerwise.commands.lens') "
        "if m in sys.modules)\nprint('IMPORTED', heavy)"
    )
    result = run_python(code)
    assert "IMPORTED []" in result.stdout, result.stdout[-2000:] + result.stderr[-2000:]


def test_layerwise_help_answers_quickly():
    """A generous bound (the measurement itself: benchmarks/startup.py): was 4-14 s when it imported Lightning."""
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "layerwise", "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 0 and "plot" in result.stdout and "fit" in result.stdout
    assert time.perf_counter() - started < 6


def test_the_static_help_table_is_each_commands_docstring():
    for name, (_, _, summary) in COMMANDS.items():
        assert (command_function(name).__doc__ or "").strip().splitlines()[0] == summary, name


def test_every_command_description_is_a_sentence_and_help_shows_no_lambda(capsys):
    for summary in [*TRAINER_COMMANDS.values(), *(entry[2] for entry in COMMANDS.values())]:
        assert summary[0].isupper() and summary.endswith("."), summary
    with pytest.raises(SystemExit):
        main(["plot", "--help"])
    out = capsys.readouterr().out
    assert "--format {png,pdf,svg}" in out and "<lambda>" not in out and "<locals>" not in out


def test_an_output_folder_under_a_file_ends_in_one_line(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(SystemExit) as exit_info:
        quickstart(tmp_path / "runs", f"--trainer.logger.init_args.save_dir={afile}")
    line = one_line(capsys, exit_info)
    assert f"`--trainer.logger.init_args.save_dir={afile}`: {afile} is a file, not a folder." in line, line


def test_a_parser_error_names_layerwise_not_main_py():
    result = subprocess.run(
        [sys.executable, "-m", "layerwise", "fit", "--config", "configs/quickstrat.yaml"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "2"},
        cwd=ROOT,
        timeout=300,
    )
    assert result.returncode == 2
    assert result.stderr.startswith("layerwise fit: error: --config: File does not exist"), result.stderr


def test_a_reader_that_stops_early_gets_no_traceback():
    """`layerwise configs | head -1`: the pipe closes after one line; the command ends without a BrokenPipeError."""
    import subprocess
    import sys

    command = f"{sys.executable} -m layerwise configs | head -1"
    result = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120)
    assert len(result.stdout.splitlines()) == 1
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr, result.stderr


def test_similarity_measure_pairs_says_it_is_now_pairs(tmp_path, capsys):
    config = tmp_path / "old.yaml"
    config.write_text(
        "trainer:\n  callbacks:\n    - class_path: layerwise.callbacks.LayerwiseAnalysis\n      init_args:\n"
        "        similarity:\n          class_path: layerwise.callbacks.LayerSimilarityMonitor\n"
        "          init_args:\n            measure_pairs: to_last\n"
    )
    with pytest.raises(SystemExit) as exit_info:
        quickstart(tmp_path, "--config", str(config))
    line = one_line(capsys, exit_info)
    assert "Option 'measure_pairs' is not accepted; it moved: renamed `pairs`" in line, line
