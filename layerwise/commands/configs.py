"""``layerwise configs``: the configs the package ships, listed with one line each, or one of them printed.

The shipped configs are the repository's ``configs/``: an installed wheel holds them as ``layerwise/configs``
(copied in when the wheel is built, ``setup.py``), a source checkout reads ``configs/`` itself. Every command's
``--config NAME`` takes a shipped config by its name, its path under ``configs/`` with or without ``.yaml``
(``--config quickstart``, ``--config transfer/digits_vit_aligned``); a file of the user's own of that name wins.

Usage::

    layerwise configs                       # every name, with the first sentence of its leading comment
    layerwise configs show quickstart       # the file itself, to copy and edit: > my.yaml
"""

import re
from pathlib import Path
from typing import Optional


def shipped_folder() -> Path:
    """Where the shipped configs are: ``layerwise/configs`` in an installed wheel, else a checkout's ``configs/``."""
    installed = Path(__file__).parents[1] / "configs"
    return installed if installed.is_dir() else Path(__file__).parents[2] / "configs"


SHIPPED = shipped_folder()
# the end of a comment's first sentence: a full stop before a capital, not one of an abbreviation (App. B, et al. (
_SENTENCE_END = re.compile(r"(?<!\bApp)(?<!\bal)(?<!\bFig)(?<!\bSec)(?<!\be\.g)(?<!\bi\.e)(?<!\bvs)\.(?=\s+[A-Z]|\s*$)")
_WIDTH = 110  # the longest description printed, in characters


def shipped_configs() -> dict[str, Path]:
    """Every shipped config by its name: its path under ``configs/`` without ``.yaml`` (``transfer/digits_probe``)."""
    if not SHIPPED.is_dir():
        return {}
    return {path.relative_to(SHIPPED).with_suffix("").as_posix(): path for path in sorted(SHIPPED.rglob("*.yaml"))}


def shipped_file(path: Path) -> Optional[Path]:
    """A file the shipped configs name by its checkout path (``configs/coupling/prompts.txt``), in the package.

    None when ``path`` is not under a ``configs/`` folder or the package ships no such file.
    """
    parts = path.as_posix().split("configs/", 1)
    if len(parts) < 2 or (parts[0] and not parts[0].endswith("/")):
        return None
    found = SHIPPED / parts[1]
    return found if found.is_file() else None


def description(path: Path) -> str:
    """The first sentence of a config's leading comment, cut to one line of at most 110 characters."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    text = " ".join(filter(None, lines))
    end = _SENTENCE_END.search(text)
    sentence = text[: end.start() + 1] if end else text
    return sentence if len(sentence) <= _WIDTH else sentence[: _WIDTH - 1].rstrip(" ,;:") + "…"


def configs(action: str = "list", name: Optional[str] = None) -> None:
    """List the configs the package ships (`--config NAME` runs one), or print one: `layerwise configs show NAME`.

    Args:
        action: ``list`` (the default): every shipped config's name and the first sentence of its leading comment;
            ``show``: print the config NAME as it is, to copy and edit (``layerwise configs show NAME > my.yaml``).
        name: the config ``show`` prints: its path under ``configs/``, with or without ``.yaml``.
    """
    shipped = shipped_configs()
    if action == "list":
        if name is not None:
            raise ValueError(f"`layerwise configs {name}`: give `layerwise configs show {name}` to print a config.")
        width = max(map(len, shipped), default=0)
        for each, path in shipped.items():
            print(f"{each:<{width}}  {description(path)}")
        print(f"({len(shipped)} configs in {SHIPPED}; `layerwise fit --config NAME` runs one)")
    elif action == "show":
        if name is None:
            raise ValueError("`layerwise configs show NAME`: give the config's name (`layerwise configs` lists them).")
        found = shipped.get(name.removesuffix(".yaml"))
        if found is None:
            said = f"`layerwise configs show {name}`: no shipped config {name!r}"
            raise ValueError(f"{said} (`layerwise configs` lists them).")
        print(found.read_text(encoding="utf-8"), end="")
    elif action.removesuffix(".yaml") in shipped:
        raise ValueError(f"`layerwise configs {action}`: give `layerwise configs show {action}` to print a config.")
    else:
        raise ValueError(f"`layerwise configs {action}`: give no word (list them) or `show NAME`.")
