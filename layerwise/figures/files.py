"""Figure files that say what they are: each records its title, provenance and the style's version.

:func:`write_figures` is how ``layerwise plot`` (one run or several) writes its files: PNG at ``--dpi``, PDF and SVG
with their titles, the run, stage and epoch in the files' metadata; with ``--no_title`` the titles come off the canvas
into that metadata and a sidecar JSON. No matplotlib at import: ``plot --help`` answers without it.
"""

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from layerwise import __version__
from layerwise.results import save_figures, write_text_atomic

DEFAULT_DPI = 300  # what journals ask of a raster figure (300-600 dpi)


def write_figures(
    figures: Mapping[str, Any],
    out: Path,
    stem: str,
    formats: Sequence[str],
    dpi: int = DEFAULT_DPI,
    titles: bool = True,
) -> list[Path]:
    """Save ``figures`` as ``out/<stem>_<name>.<format>``, each file recording its title and the style's version.

    ``titles=False`` (``plot --no_title``): the titles come off the canvas (a paper's caption says what a figure
    shows) and go, with the run, stage and epoch they named, into each file's metadata (PDF ``Title``/``Subject``,
    PNG text) and a sidecar ``<stem>_<name>.json``. Every file records :data:`~layerwise.figures.style.STYLE_VERSION`.
    """
    from layerwise.figures.style import STYLE_VERSION, provenance_metadata, untitled

    written: list[Path] = []
    if not titles:
        for name, figure in figures.items():
            lines = untitled(figure) if getattr(figure, "_layerwise_provenance", None) is None else []
            lines = figure._layerwise_provenance or lines
            sidecar = {
                "figure": name,
                "title": lines[0] if lines else "",
                "provenance": lines[1:],
                "files": [f"{stem}_{name}.{fmt}" for fmt in formats],
                "style_version": STYLE_VERSION,
                "layerwise": __version__,
            }
            written.append(write_text_atomic(out / f"{stem}_{name}.json", json.dumps(sidecar, indent=1) + "\n"))
    return save_figures(figures, out, stem, formats, dpi=dpi, metadata=provenance_metadata) + written
