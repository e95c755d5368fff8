"""The one ``layerwise`` command line: :class:`LayerwiseCLI`, the :data:`COMMANDS` registry and ``main``.

LayerwiseCLI (LightningCLI) runs fit, validate, test and predict; the other commands are typed functions next to
what they run, each a parser from its signature (``parser.py``), with one error style (``errors.py``).
"""

import functools
import importlib
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn, Optional

from jsonargparse import ArgumentParser

from layerwise.cli.errors import bad_config_file, check_output_folders, class_options, exit_concisely, quiet_upstream
from layerwise.cli.help_cache import is_plain_help, print_help
from layerwise.cli.parser import command_parser, with_shipped_configs
from layerwise.errors import DEBUG_VARIABLE


@functools.cache
def _trainer_classes() -> tuple[type, type]:
    """``(_ConciseArgumentParser, LayerwiseCLI)``, defined on first use (``--help`` and the rest need no Lightning)."""
    import torch
    from jsonargparse.typing import PositiveInt
    from lightning.pytorch import LightningModule
    from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

    from layerwise.callbacks import ProgressLines
    from layerwise.cli.closing import ClosingLine
    from layerwise.cli.preemption import EXIT_CODES as PREEMPTED_EXIT_CODES
    from layerwise.cli.preemption import add_preemption, resume_into_run
    from layerwise.cli.runs import KeptConfig, place_logger, read_position, take_position, test_split_line
    from layerwise.cli.summary import replace_default_summary
    from layerwise.errors import UsageError
    from layerwise.lightning_modules import LayerwiseModule
    from layerwise.lightning_modules.base import check_data_compatible

    class _ConciseArgumentParser(LightningArgumentParser):
        """LightningCLI's parser, errors cut to one line naming the option (the whole of it with LAYERWISE_DEBUG=1)."""

        def error(self, message: str, ex: Optional[Exception] = None) -> NoReturn:
            if os.environ.get(DEBUG_VARIABLE) or not getattr(self, "exit_on_error", True):
                super().error(message, ex)
            if "Problems parsing config" in message:
                message = f"{bad_config_file(getattr(self, 'argv', None))}{message}"
            prog = re.sub(r"^\S+", "layerwise", self.prog.replace(" [options]", ""))  # not __main__.py (python -m)
            exit_concisely(prog, message)

        def add_method_arguments(self, *args: Any, **kwargs: Any) -> list[str]:
            """``validate``/``test`` default to ``--verbose false``: layerwise prints its own per-layer table."""
            added = super().add_method_arguments(*args, **kwargs)
            if "verbose" in added:
                self.set_defaults(verbose=False)
            return added

    class LayerwiseCLI(LightningCLI):
        """LightningCLI over any LightningModule and any LightningDataModule.

        The modules are every :class:`~layerwise.lightning_modules.LayerwiseModule` strategy,
        :class:`~layerwise.lightning_modules.Stitched`, or your own.

        ``--model`` and ``--data`` take a ``class_path`` (e.g. ``layerwise.lightning_modules.AlternatingAligned``,
        ``layerwise.datamodules.DigitsDataModule``) with ``init_args``; several ``--config`` files compose.
        """

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("model_class", LightningModule)  # LayerwiseModule strategies, Stitched, any other module
            kwargs.setdefault("subclass_mode_model", True)
            kwargs.setdefault("subclass_mode_data", True)
            kwargs.setdefault("save_config_callback", KeptConfig)  # an earlier run's config.yaml is moved aside
            kwargs.setdefault("save_config_kwargs", {"overwrite": True})
            kwargs.setdefault("parser_class", _ConciseArgumentParser)
            if not sys.stdout.isatty():  # a log file shows a bar only at the end: plain lines instead (see after_...)
                kwargs["trainer_defaults"] = {"enable_progress_bar": False, **(kwargs.get("trainer_defaults") or {})}
            given = kwargs.get("args")
            self._argv = list(given) if isinstance(given, (list, tuple)) else None  # None: sys.argv
            super().__init__(*args, **kwargs)

        def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
            """LightningCLI's parser (and each subcommand's), knowing the arguments it parses (a bad --config file)."""
            parser = super().init_parser(**kwargs)
            parser.argv = self._argv
            return parser

        def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
            parser.add_argument("--threads", type=Optional[PositiveInt], help=THREADS_HELP)

        def before_instantiate_classes(self) -> None:
            """``validate``/``test --ckpt_path``: log beside the checkpoint's run; ``predict``: no log folder at all."""
            super().before_instantiate_classes()
            self._position = None
            subcommand = self.config.get("subcommand")
            threads = (self.config.get(subcommand) if subcommand else self.config).get("threads")
            if threads:  # before any tensor work; OMP_NUM_THREADS keeps Lightning's DDP launcher from resetting it
                torch.set_num_threads(threads)
                os.environ["OMP_NUM_THREADS"] = str(threads)
            if subcommand == "fit" and self.config.fit.get("ckpt_path"):  # a resume continues in its run's folder
                if resume_into_run(self.config.fit.trainer, self.config.fit.ckpt_path) is not None:
                    self.save_config_callback = None  # the run keeps the config.yaml it started with
            if subcommand not in ("validate", "test", "predict"):
                return
            config = self.config[subcommand]
            self._position = read_position(config.get("ckpt_path")) if config.get("ckpt_path") else None
            if subcommand == "predict":  # it logs nothing (the predictions go to Python or a writer callback)
                if any(str(arg).startswith("--trainer.logger") for arg in (self._argv or sys.argv[1:])):
                    print("layerwise predict: --trainer.logger is not used: predict logs nothing.", file=sys.stderr)
                config.trainer.logger = False
                self.save_config_callback = None
            elif self._position is not None:
                place_logger(config.trainer, subcommand, self._position)

        def after_instantiate_classes(self) -> None:
            """The command's closing line; without a terminal and a progress bar, a fit prints plain progress lines."""
            super().after_instantiate_classes()
            trainer = getattr(self, "trainer", None)
            if trainer is not None:
                self._summary_without_uncounted_flops(trainer)
                if self.subcommand is not None:  # the command's last line, printed where the work ran
                    fit = self.subcommand == "fit" and read_position(self.config.fit.get("ckpt_path") or "")
                    start = fit.global_step if fit else 0  # the step a fit resumed from
                    trainer.callbacks.append(ClosingLine(self.subcommand, start, self._position))
                if self.subcommand == "fit":  # SIGTERM/SIGUSR1: a resumable checkpoint, a closing line, exit 128+N
                    add_preemption(trainer, self._argv or sys.argv[1:])
            if trainer is None or sys.stdout.isatty() or trainer.progress_bar_callback is not None:
                return
            if self.subcommand == "fit" and not any(isinstance(c, ProgressLines) for c in trainer.callbacks):
                trainer.callbacks.append(ProgressLines())

        def _summary_without_uncounted_flops(self, trainer: Any) -> None:
            """Lightning's default model summary -> ``CountedModelSummary``; a configured one stays as configured."""
            config = self.config.get(self.subcommand) if self.subcommand else self.config
            replace_default_summary(trainer, config.get("trainer.callbacks") if config else None, self.trainer_defaults)

        @contextmanager
        def _errors_in_one_line(self, kinds: tuple[type[Exception], ...], parsed: bool = True) -> Iterator[None]:
            """A bad value found by a class itself (not by the parser) ends in one line naming the flag, too.

            ``parsed=False``: the package's own messages (:class:`~layerwise.errors.UsageError`, a missing
            ``--ckpt_path``), one sentence already, printed as they are. The traceback with LAYERWISE_DEBUG=1.
            """
            try:
                yield
            except kinds as error:
                if os.environ.get(DEBUG_VARIABLE):
                    raise
                prog = f"layerwise {self.subcommand or ''}".strip()
                subcommand = self.config.get("subcommand")
                config = self.config.get(subcommand) if subcommand else self.config
                exit_concisely(prog, str(error), parsed=parsed, class_options=class_options(config) if parsed else None)

        def instantiate_classes(self) -> None:
            """Instantiate as LightningCLI does; a bad value found by a class itself ends in one line naming it."""
            from lightning.fabric.utilities.exceptions import MisconfigurationException  # the Trainer's own checks

            with self._errors_in_one_line((ValueError, TypeError, MisconfigurationException)):
                super().instantiate_classes()

        def _parse_ckpt_path(self) -> None:
            """``--ckpt_path`` checked before LightningCLI reads it: a truncated or foreign file, in one line."""
            subcommand = self.config.get("subcommand")
            ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
            lightnings = (
                ckpt_path in ("best", "last", "hpc") or str(ckpt_path).startswith("registry") or "://" in str(ckpt_path)
            )  # Lightning resolves these itself
            if ckpt_path and (Path(ckpt_path).exists() or not lightnings):  # a missing file: "no such file", naming it
                from layerwise.lightning_modules.checkpoint import check_checkpoint

                try:
                    check_checkpoint(ckpt_path, "--ckpt_path")
                except ValueError as error:
                    if os.environ.get(DEBUG_VARIABLE):
                        raise
                    exit_concisely(f"layerwise {subcommand}", str(error), parsed=False)
            super()._parse_ckpt_path()

        def _run_subcommand(self, subcommand: str) -> None:
            """A mistake found once the run started (UsageError, missing file, anomaly mode's NaN) ends in one line."""
            with self._errors_in_one_line((UsageError, FileNotFoundError), parsed=False):
                try:
                    super()._run_subcommand(subcommand)
                except torch.multiprocessing.ProcessExitedException as error:  # ddp_spawn: a worker was preempted
                    if error.exit_code not in PREEMPTED_EXIT_CODES:
                        raise
                    raise SystemExit(error.exit_code) from None  # its closing line is printed: no traceback here
                except RuntimeError as error:  # autograd's anomaly mode found a NaN/inf: the user asked it to stop
                    if "returned nan values" not in str(error):
                        raise
                    raise UsageError(f"`--trainer.detect_anomaly=true` stopped the run: {error}") from error

        def _check_before_run(self) -> None:
            # Before the Trainer creates log folders or touches data: a bad combination leaves nothing behind.
            if isinstance(self.model, LayerwiseModule):
                with self._errors_in_one_line((ValueError,)):
                    check_data_compatible(self.model, self.datamodule)
            check_output_folders(self.trainer, run_folder=self.save_config_callback is not None)

        def before_fit(self) -> None:
            self._check_before_run()
            for option in ("max_epochs", "max_steps"):
                if getattr(self.trainer, option) == 0:  # Lightning would return at once, leaving an empty run folder
                    raise UsageError(
                        f"`--trainer.{option}=0` trains nothing: give 1 or more (to analyse a checkpoint without "
                        "training: `layerwise validate --ckpt_path …`)."
                    )

        def _before_evaluation(self) -> None:
            self._check_before_run()
            if self._position is not None:
                take_position(self.trainer, self._position)

        def before_validate(self) -> None:
            self._before_evaluation()

        def before_test(self) -> None:
            self._before_evaluation()
            line = test_split_line(self.datamodule)
            if line and self.trainer.is_global_zero:
                print(line, flush=True)

        before_predict = _before_evaluation

    for cls in (_ConciseArgumentParser, LayerwiseCLI):
        cls.__qualname__ = cls.__name__  # layerwise.cli.app.LayerwiseCLI, as if at the top (module __getattr__)
    return _ConciseArgumentParser, LayerwiseCLI


def __getattr__(name: str) -> Any:
    """``LayerwiseCLI`` (and its parser class) on first use, importing Lightning then."""
    classes = {"_ConciseArgumentParser": 0, "LayerwiseCLI": 1}
    if name in classes:
        return _trainer_classes()[classes[name]]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


THREADS_HELP = "torch's intra-op threads of this process (default: torch's, one per core; the quickstart sets 1)."
TRAINER_COMMANDS = {
    "fit": "Train a model, analysing every validation (LightningCLI).",
    "validate": "Analyse a model on the validation set (LightningCLI).",
    "test": "Analyse a model on the test set (LightningCLI).",
    "predict": "Predict, optionally with early exit (LightningCLI).",
}


# ------------------------------------------------------------------------------------- the other commands
# Each is a typed function next to what it runs; its signature and Google docstring are its parser and --help.
# Named here, not imported: a command's module (torch, matplotlib, transformers...) is imported only when that command
# runs or its --help is asked for. The one-line help is the function docstring's first line (a test keeps them equal).
COMMANDS: dict[str, tuple[str, str, str]] = {
    "plot": ("layerwise.figures.plot", "plot", "Render the paper-style figures of layerwise summaries to PNG/PDF/SVG."),
    "export": (
        "layerwise.inference.export",
        "export",
        "Export the first d blocks plus the shared head of a layerwise checkpoint as a standalone model.",
    ),
    "sweep": (
        "layerwise.inference.sweep",
        "sweep",
        "Accuracy against speedup of confidence-threshold early exit, from the latest validation summary of each run.",
    ),
    "generate": (
        "layerwise.inference.generation",
        "generate",
        "Continue a prompt with blocks 1..l and the model's own final norm + LM head (Hugging Face's generate).",
    ),
    "lens": (
        "layerwise.inference.lens",
        "lens",
        "What the shared head predicts from every layer at every position the full model generates greedily.",
    ),
    "coupling": (
        "layerwise.inference.coupling",
        "coupling",
        "Block coupling of a causal LM over prompts (Aristide et al., 2024), or the regression of scores on it.",
    ),
    "compare": (
        "layerwise.inference.compare",
        "compare",
        "CKA between every layer of two models on the same tokens, and their arccos distance (Brown et al., 2023).",
    ),
    "stitch": (
        "layerwise.inference.stitch",
        "stitch",
        "Stitching penalties of two causal LMs or two classifiers over a grid of layers (Brown et al., 2023).",
    ),
    "clip": (
        "layerwise.inference.clip",
        "clip",
        "Layer-wise COS of a CLIP model within and across modalities (App. D of Jiang et al.).",
    ),
    "report": (
        "layerwise.figures.report",
        "report",
        "Write one self-contained HTML report of a run (config, per-layer tables, figures, curves over training).",
    ),
}


def command_function(name: str) -> Callable[..., None]:
    """The function of command ``name``, its module imported now."""
    module, function, _ = COMMANDS[name]
    return getattr(importlib.import_module(module), function)


def build_parser() -> ArgumentParser:
    """The top-level parser: every subcommand with its one-line help (``layerwise --help``)."""
    parser = ArgumentParser(
        prog="layerwise",
        description="Trace how representations progress through the layers of a transformer. `layerwise COMMAND "
        "--help` shows the options of a command.",
    )
    subcommands = parser.add_subcommands(dest="command", required=False, metavar="COMMAND")  # required: see main
    for name, help_text in TRAINER_COMMANDS.items():
        subcommands.add_subcommand(name, ArgumentParser(prog=f"layerwise {name}"), help=help_text)
    for name, (_, _, summary) in COMMANDS.items():  # names and one line each: nothing imported for --help
        subcommands.add_subcommand(name, ArgumentParser(prog=f"layerwise {name}"), help=summary)
    return parser


def run_command(name: str, argv: list[str]) -> None:
    """Parse ``argv`` for command ``name`` and run it; a bad value ends in one ``error:`` line naming the flag."""
    function = command_function(name)
    parser = command_parser(name, function)
    config = parser.parse_args(argv)
    arguments = {key: value for key, value in vars(config).items() if key != "config"}
    try:
        function(**arguments)
    except (ValueError, TypeError, FileNotFoundError, RuntimeError) as error:
        if os.environ.get(DEBUG_VARIABLE):
            raise
        exit_concisely(f"layerwise {name}", str(error), parsed=False)


def main(args: Optional[list[str]] = None) -> None:
    """Entry point of ``layerwise`` and ``python -m layerwise``."""
    quiet_upstream()
    argv = with_shipped_configs(args)  # `--config quickstart`: the config the package ships
    if argv and argv[0] in COMMANDS:
        run_command(argv[0], argv[1:])
    elif args is None and argv and argv[0] in TRAINER_COMMANDS and is_plain_help(argv):  # a fresh process only:
        print_help(argv[0], lambda: _trainer_classes()[1](args=args))  # in-process callers may list their classes
    elif argv and argv[0] in TRAINER_COMMANDS or argv[:1] and argv[0].startswith("--config"):
        _trainer_classes()[1](args=None if args is None else argv)  # None: LightningCLI reads sys.argv
    else:  # --help lists every command; anything else is an error naming the choices
        parser = build_parser()
        if parser.parse_args(argv).command is None:  # not `required` for jsonargparse: it would add a "(required)" line
            parser.error(f"give a command, one of {', '.join([*TRAINER_COMMANDS, *COMMANDS])}.")
