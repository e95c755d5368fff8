"""The one ``layerwise`` command line: the :data:`COMMANDS` registry and ``main``.

:class:`~layerwise.cli.trainer.LayerwiseCLI` (LightningCLI, ``trainer.py``, imported only when it runs) runs fit,
validate, test and predict; the other commands are typed functions in ``layerwise/commands/`` (``plot`` and
``report`` in ``figures/``), each a parser from its signature (``parser.py``), with one error style (``errors.py``).
"""

import importlib
import os
import sys
from collections.abc import Callable
from typing import Optional

from jsonargparse import ArgumentParser

from layerwise import __version__
from layerwise.cli.errors import exit_concisely, quiet_upstream
from layerwise.cli.help_cache import is_plain_help, print_help
from layerwise.cli.parser import command_parser, with_shipped_configs
from layerwise.errors import DEBUG_VARIABLE

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
        "layerwise.commands.export",
        "export",
        "Export the first d blocks plus the shared head of a layerwise checkpoint as a standalone model.",
    ),
    "sweep": (
        "layerwise.commands.sweep",
        "sweep",
        "Accuracy against speedup of confidence-threshold early exit, from the latest validation summary of each run.",
    ),
    "generate": (
        "layerwise.commands.generate",
        "generate",
        "Continue a prompt with blocks 1..l and the model's own final norm + LM head (Hugging Face's generate).",
    ),
    "lens": (
        "layerwise.commands.lens",
        "lens",
        "What the shared head predicts from every layer at every position the full model generates greedily.",
    ),
    "coupling": (
        "layerwise.commands.coupling",
        "coupling",
        "Block coupling of a causal LM over prompts (Aristide et al., 2024), or the regression of scores on it.",
    ),
    "compare": (
        "layerwise.commands.compare",
        "compare",
        "CKA between every layer of two models on the same tokens, and their arccos distance (Brown et al., 2023).",
    ),
    "stitch": (
        "layerwise.commands.stitch",
        "stitch",
        "Stitching penalties of two causal LMs or two classifiers over a grid of layers (Brown et al., 2023).",
    ),
    "clip": (
        "layerwise.commands.clip",
        "clip",
        "Layer-wise COS of a CLIP model within and across modalities (App. D of Jiang et al.).",
    ),
    "configs": (
        "layerwise.commands.configs",
        "configs",
        "List the configs the package ships (`--config NAME` runs one), or print one: `layerwise configs show NAME`.",
    ),
    "report": (
        "layerwise.figures.report",
        "report",
        "Write one self-contained HTML report of a run (config, per-layer tables, figures, curves over training).",
    ),
}


def trainer_cli() -> type:
    """:class:`~layerwise.cli.trainer.LayerwiseCLI`, its module (Lightning, torch) imported now."""
    from layerwise.cli.trainer import LayerwiseCLI

    return LayerwiseCLI


def command_function(name: str) -> Callable[..., None]:
    """The function of command ``name``, its module imported now."""
    module, function, _ = COMMANDS[name]
    return getattr(importlib.import_module(module), function)


def build_parser() -> ArgumentParser:
    """The top-level parser: every subcommand with its one-line help (``layerwise --help``)."""
    parser = ArgumentParser(
        prog="layerwise",
        description=f"layerwise {__version__}: trace how representations progress through the layers of a "
        "transformer. `layerwise COMMAND --help` shows the options of a command; `--config NAME` runs a config the "
        "package ships (`layerwise configs` lists them).",
    )
    parser.add_argument("-V", "--version", action="version", version=f"layerwise {__version__}")
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
    from layerwise.cli.errors import failed_writes_in_one_line

    try:
        with failed_writes_in_one_line(f"layerwise {name}"):  # a full disk, a vanished folder: the path and the cause
            function(**arguments)
    except (ValueError, TypeError, FileNotFoundError, RuntimeError) as error:
        if os.environ.get(DEBUG_VARIABLE):
            raise
        exit_concisely(f"layerwise {name}", str(error), parsed=False)


def main(args: Optional[list[str]] = None) -> None:
    """Entry point of ``layerwise`` and ``python -m layerwise``."""
    try:
        _main(args)
    except BrokenPipeError:  # `layerwise configs | head`: the reader has what it wanted; no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's own recipe (signal docs)
        sys.exit(1)


def _main(args: Optional[list[str]]) -> None:
    quiet_upstream()
    argv = with_shipped_configs(args)  # `--config quickstart`: the config the package ships
    if argv and argv[0] in COMMANDS:
        run_command(argv[0], argv[1:])
    elif args is None and argv and argv[0] in TRAINER_COMMANDS and is_plain_help(argv):  # a fresh process only:
        print_help(argv[0], lambda: trainer_cli()(args=args))  # in-process callers may list their classes
    elif argv and argv[0] in TRAINER_COMMANDS or argv[:1] and argv[0].startswith("--config"):
        trainer_cli()(args=None if args is None else argv)  # None: LightningCLI reads sys.argv
    else:  # --help lists every command, --version says it; anything else is an error naming the choices
        parser = build_parser()
        if parser.parse_args(argv).command is None:  # not `required` for jsonargparse: it would add a "(required)" line
            parser.error(f"give a command, one of {', '.join([*TRAINER_COMMANDS, *COMMANDS])}.")
