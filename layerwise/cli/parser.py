"""A command function as a command line: its jsonargparse parser, built from its signature and Google docstring.

``layerwise plot``, ``compare``, ``stitch``... are typed functions next to what they run
(:data:`layerwise.cli.app.COMMANDS`); :func:`command_parser` gives each ``--snake_case`` flags, ``--help`` from the
docstring, ``--config FILE`` and ``--print_config``. Every command's ``--config NAME`` of a config the package
ships is that file (:func:`with_shipped_configs`): ``layerwise fit --config quickstart`` runs from any folder.
"""

import inspect
import os
import sys
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, NoReturn, Optional, Union

from jsonargparse import ActionConfigFile, ArgumentParser

from layerwise.cli.errors import exit_concisely
from layerwise.errors import DEBUG_VARIABLE

_POSITIONAL = {"path", "runs"}


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
    parser.add_argument("--config", action=ActionConfigFile, help="a YAML file with any of the options below")
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
        extra = {} if key in _POSITIONAL else {"default": parameter.default}
        if choices:  # argparse's own str (no type=: jsonargparse would show its wrapper, a lambda, in --help)
            extra["choices"] = choices
        else:
            extra["type"] = item or hints[key]
        parser.add_argument(flag, nargs="+" if item else None, help=help_of.get(key), **extra)
    return parser


SHIPPED = Path(__file__).parents[1] / "configs"  # copies of files under the repository's configs/, byte for byte
_CONFIG_FLAGS = ("--config", "-c")


def shipped_config(name: str) -> Optional[Path]:
    """The shipped config called ``name`` (``quickstart`` or ``quickstart.yaml``); None for a file of the user's own."""
    shipped = {str(path.relative_to(SHIPPED).with_suffix("")): path for path in SHIPPED.rglob("*.yaml")}
    path = shipped.get(name.removesuffix(".yaml"))
    return None if path is None or Path(name).is_file() else path


def with_shipped_configs(args: Optional[list[str]]) -> list[str]:
    """``args`` (None: ``sys.argv[1:]``), each ``--config NAME`` of a shipped config given as its path.

    Given None, ``sys.argv`` is rewritten too: LightningCLI reads it itself.
    """
    argv = sys.argv[1:] if args is None else list(args)
    for index, arg in enumerate(argv):
        flag, equals, value = arg.partition("=")
        if equals and flag in _CONFIG_FLAGS and (path := shipped_config(value)):
            argv[index] = f"{flag}={path}"
        elif index and argv[index - 1] in _CONFIG_FLAGS and (path := shipped_config(arg)):
            argv[index] = str(path)
    if args is None:
        sys.argv[1:] = argv
    return argv
