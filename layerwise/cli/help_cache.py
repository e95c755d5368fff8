"""The ``--help`` of ``fit``/``validate``/``test``/``predict``, kept after its first rendering (issue 23.14).

LightningCLI builds that help from the Trainer's, the modules' and the callbacks' signatures, so it needs Lightning,
whose import alone takes 6 s on 2 cores (torchmetrics pulls torchvision, scipy and transformers in). The text depends
only on the installed packages, layerwise's own source and the terminal width, so the first ``layerwise fit --help``
renders it and stores it under a key made of those; a later one with the same key prints the stored text without
importing any of them. A changed package, a changed source file or another width renders it again. Only the command
line keeps a text (``main()`` reading ``sys.argv``): a Python caller of ``main([...])`` may have imported subclasses of
its own, which LightningCLI's help would list.

The store is ``$LAYERWISE_CACHE_DIR`` (default ``$XDG_CACHE_HOME/layerwise``, else ``~/.cache/layerwise``); a store
that cannot be written is skipped silently (the help is still printed).
"""

import contextlib
import hashlib
import io
import os
import shutil
import sys
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import NoReturn, Optional

PACKAGES = ("lightning", "jsonargparse", "torch", "torchmetrics", "transformers", "timm", "torchvision")
HELP_FLAGS = ("-h", "--help")


def cache_folder() -> Path:
    """Where the rendered help texts are kept."""
    if os.environ.get("LAYERWISE_CACHE_DIR"):
        return Path(os.environ["LAYERWISE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "layerwise"


def help_key(command: str) -> str:
    """A digest of everything the help text of ``command`` depends on."""
    digest = hashlib.sha256(f"{command}\0{sys.version}\0{shutil.get_terminal_size().columns}".encode())
    for name in PACKAGES:
        try:
            digest.update(f"\0{name}={metadata.version(name)}".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"\0{name}=-".encode())
    package = Path(__file__).resolve().parents[1]  # all of layerwise, not only cli/
    for path in sorted(package.rglob("*.py")):
        digest.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:32]


def is_plain_help(argv: list[str]) -> bool:
    """``COMMAND --help`` alone: a config file or other flags change the help, so only this form is kept."""
    return len(argv) == 2 and argv[1] in HELP_FLAGS


def stored_help(command: str) -> Optional[str]:
    """The stored help of ``command`` for the current key, else None."""
    path = cache_folder() / f"{command}-{help_key(command)}.txt"
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def store_help(command: str, text: str) -> None:
    """Keep ``text`` as the help of ``command`` for the current key (and drop that command's older texts)."""
    folder = cache_folder()
    path = folder / f"{command}-{help_key(command)}.txt"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        temporary = folder / f".{path.name}.{os.getpid()}.tmp"
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)
        for old in folder.glob(f"{command}-*.txt"):
            if old != path:
                old.unlink(missing_ok=True)
    except OSError:
        pass


def print_help(command: str, render: Callable[[], None]) -> NoReturn:
    """Print the help of ``command``: the stored text, else what ``render`` prints (then stored); exit 0.

    ``render`` is the LightningCLI call that prints the help and exits; what it prints is captured. Any other exit
    (an error) goes on as it came, with what it printed.
    """
    text = stored_help(command)
    if text is None:
        buffer = io.StringIO()
        try:
            with contextlib.redirect_stdout(buffer):
                render()
        except SystemExit as stop:
            if stop.code not in (0, None):
                sys.stdout.write(buffer.getvalue())
                raise
        text = buffer.getvalue()
        store_help(command, text)
    sys.stdout.write(text)
    sys.exit(0)
