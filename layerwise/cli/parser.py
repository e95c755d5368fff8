"""A command function as a command line: its jsonargparse parser, built from its signature and Google docstring.

``layerwise plot``, ``compare``, ``stitch``... are typed functions next to what they run
(:data:`layerwise.cli.app.COMMANDS`); :func:`command_parser` gives each ``--snake_case`` flags, ``--help`` from the
docstring, ``--config FILE`` and ``--print_config``. Every command's ``--config NAME`` of a config the package
ships is that file (:func:`with_shipped_configs`): ``layerwise fit --config quickstart`` runs from any folder.
"""

import inspect
import os
import re
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, NoReturn, Optional, Union

from jsonargparse import ActionConfigFile, ArgumentParser

from layerwise.cli.errors import exit_concisely
from layerwise.commands.configs import shipped_configs
from layerwise.errors import DEBUG_VARIABLE

_POSITIONAL = {"path", "runs", "action", "name"}  # action, name: `layerwise configs show NAME`


class _ConciseParser(ArgumentParser):
    """A command's parser whose errors are one line naming the option (the whole message with LAYERWISE_DEBUG=1)."""

    def error(self, message: str, ex: Optional[Exception] = None) -> NoReturn:
        if os.environ.get(DEBUG_VARIABLE) or not getattr(self, "exit_on_error", True):
            super().error(message, ex)
        exit_concisely(self.prog, message)


def _list_item(annotation: Any) -> Optional[Any]:
    """The item type of ``list[X]`` / ``Optional[list[X]]``, else None."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if typing.get_origin(candidate) is list:
            return typing.get_args(candidate)[0]
    return None


def command_parser(name: str, function: Callable[..., None]) -> ArgumentParser:
    """A jsonargparse parser from a command function's signature and Google docstring.

    List parameters take several values after one flag (``--layers 1 4``); ``path``/``runs`` are positional.
    """
    from docstring_parser import parse

    docs = parse(function.__doc__ or "")
    help_of = {param.arg_name: param.description for param in docs.params}
    parser = _ConciseParser(
        prog=f"layerwise {name}",
        description=" ".join(filter(None, [docs.short_description, docs.long_description])),
    )
    parser.add_argument(
        "--config",
        action=ActionConfigFile,
        help="a YAML file with any of the options below, or a shipped config's name (`layerwise configs` lists them)",
    )
    hints = typing.get_type_hints(function)
    manual: set[Union[str, int]] = {
        key for key in hints if key != "return" and (key in _POSITIONAL or _list_item(hints[key]) is not None)
    }
    parser.add_function_arguments(function, skip=manual, as_positional=False)
    for key, parameter in inspect.signature(function).parameters.items():
        if key not in manual:
            continue
        item = _list_item(hints[key])
        choices = list(typing.get_args(item)) if typing.get_origin(item) is Literal else None
        flag = key if key in _POSITIONAL else f"--{key}"
        extra: dict[str, Any] = {} if key in _POSITIONAL else {"default": parameter.default}
        nargs = "+" if item else None
        if key in _POSITIONAL and parameter.default is not inspect.Parameter.empty:  # an optional positional
            nargs, extra["default"] = "?", parameter.default
        if choices:  # argparse's own str (no type=: jsonargparse would show its wrapper, a lambda, in --help)
            extra["choices"] = choices
        else:
            extra["type"] = item or hints[key]
        parser.add_argument(flag, nargs=nargs, help=help_of.get(key), **extra)
    return parser


_CONFIG_FLAGS = ("--config", "-c")
CONFIG_HELP = (
    "a YAML config file, or the name of a config the package ships (`--config quickstart`, "
    "`--config transfer/digits_probe`; `layerwise configs` lists them); several compose, the later winning."
)


def say_configs_have_names(parser: ArgumentParser) -> None:
    """LightningCLI's ``--config`` help ("Path to a configuration file") saying that a shipped config has a name."""
    for action in parser._actions:
        if "--config" in action.option_strings:
            action.help = CONFIG_HELP


_IN_CONFIGS = re.compile(r"(?:^|/)configs/(.+)$")  # configs/quickstart, ../configs/transfer/digits_probe


def shipped_name(name: str) -> Optional[str]:
    """The shipped config's name that ``name`` means (``quickstart``, ``quickstart.yaml``, ``configs/quickstart.yaml``).

    None when nothing shipped has that name.
    """
    stem = name.removesuffix(".yaml").replace("\\", "/")
    shipped = shipped_configs()
    if stem in shipped:
        return stem
    below = _IN_CONFIGS.search(stem)
    return below.group(1) if below and below.group(1) in shipped else None


def shipped_config(name: str) -> Optional[Path]:
    """The shipped config called ``name`` (``quickstart`` or ``quickstart.yaml``); None for a file of the user's own."""
    if Path(name).is_file() or _IN_CONFIGS.search(name.replace("\\", "/")):  # a path into configs/: the user's own
        return None
    found = shipped_name(name)
    return None if found is None else shipped_configs()[found]


def missing_shipped_file(name: str) -> Optional[str]:
    """For ``configs/quickstart.yaml`` that is not here but shipped: the line that names ``--config quickstart``."""
    if Path(name).exists() or shipped_config(name) is not None or (found := shipped_name(name)) is None:
        return None
    return f"--config: no file {name} here; the shipped config is `--config {found}` (`layerwise configs` lists them)."


def with_shipped_configs(args: Optional[list[str]]) -> list[str]:
    """``args`` (None: ``sys.argv[1:]``), each ``--config NAME`` of a shipped config given as its path.

    Given None, ``sys.argv`` is rewritten too: LightningCLI reads it itself. A missing ``configs/NAME.yaml`` that is
    shipped ends the command in one line naming ``--config NAME``.
    """
    argv = sys.argv[1:] if args is None else list(args)
    for index, arg in enumerate(argv):
        flag, equals, value = arg.partition("=")
        if equals and flag in _CONFIG_FLAGS:
            prefix, given = f"{flag}=", value
        elif index and argv[index - 1] in _CONFIG_FLAGS:
            prefix, given = "", arg
        else:
            continue
        if path := shipped_config(given):
            argv[index] = f"{prefix}{path}"
        elif line := missing_shipped_file(given):
            prog = " ".join(["layerwise", *argv[:1]]) if argv[:1] and not argv[0].startswith("-") else "layerwise"
            exit_concisely(prog, line, parsed=False)
    if args is None:
        sys.argv[1:] = argv
    return argv
