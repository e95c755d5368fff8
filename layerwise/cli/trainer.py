"""``LayerwiseCLI``: LightningCLI for fit, validate, test and predict, with the command line's one error style.

Imported only when one of those commands runs (or renders its ``--help`` the first time): it imports Lightning and
torch, which ``layerwise --help`` and every other command's ``--help`` never do (``tests/cli/test_command_help.py``).
"""

import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn, Optional

import torch
from jsonargparse.typing import PositiveInt
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from layerwise.callbacks import ProgressLines
from layerwise.cli.closing import ClosingLine
from layerwise.cli.errors import bad_config_file, check_output_folders, class_options, exit_concisely
from layerwise.cli.parser import say_configs_have_names
from layerwise.cli.peers import machine_failures_in_one_line
from layerwise.cli.preemption import EXIT_CODES as PREEMPTED_EXIT_CODES
from layerwise.cli.preemption import add_preemption, resume_into_run
from layerwise.cli.runs import KeptConfig, place_logger, take_position, test_split_line
from layerwise.cli.summary import replace_default_summary
from layerwise.engines.checkpoint import read_position
from layerwise.errors import DEBUG_VARIABLE, UsageError
from layerwise.lightning_modules import LayerwiseModule
from layerwise.lightning_modules.base import check_data_compatible

THREADS_HELP = "torch's intra-op threads of this process (default: torch's, one per core; the quickstart sets 1)."


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
        say_configs_have_names(parser)
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
            from layerwise.engines.checkpoint import check_checkpoint

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
                with machine_failures_in_one_line(subcommand, self):  # a full disk, a dead rank (peers.py)
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
