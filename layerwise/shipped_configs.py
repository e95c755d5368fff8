"""The configs the package ships, run by name from any folder: ``layerwise fit --config quickstart``.

``layerwise/configs/`` holds copies of files under the repository's ``configs/``, byte for byte (a test compares
them), so that an installed wheel runs the main job without a clone of the repository.
"""

import sys
from pathlib import Path
from typing import Optional

SHIPPED = Path(__file__).parent / "configs"
CONFIG_FLAGS = ("--config", "-c")


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
        if equals and flag in CONFIG_FLAGS and (path := shipped_config(value)):
            argv[index] = f"{flag}={path}"
        elif index and argv[index - 1] in CONFIG_FLAGS and (path := shipped_config(arg)):
            argv[index] = str(path)
    if args is None:
        sys.argv[1:] = argv
    return argv
