"""``layerwise report``: one self-contained HTML file of a run, to open in any browser or attach to a message.

The file needs no server and no network: the run's config, every summary (an inline JSON blob), the figures of one
validation (PNG data URIs) and a small inline script that draws the per-layer table and the curves over training
(inline SVG) for the validation the slider picks. It reads the results files only (see :mod:`layerwise.results`).

A report is shared, and what it shows is data: every value of a summary or config reaches the page as text (escaped
here, ``esc`` in ``report.js``), and the page's Content-Security-Policy (:func:`content_security_policy`) runs its one
script, by hash, and nothing else: no inline handler, no remote load.
"""

import base64
import hashlib
import html
import io
import json
from pathlib import Path
from typing import Any, Literal, Optional

from layerwise.errors import LayerwiseWarning
from layerwise.results import find_summaries, load_summary, summary_order, write_text_atomic

# figures of summary_figures() that belong to a section of their own, not to the general figures
SECTION_FIGURES = {
    "coupling": ("coupling_depth", "coupling_spectra", "coupling_trajectory"),
    "compare": ("compare_cka", "compare_cca", "compare_svcca", "compare_pwcca", "compare_procrustes", "compare_shape"),
    "detection_ap50": ("detection_ap50",),
}
CONFIG_FILES = ("config.yaml", "hparams.yaml")  # LightningCLI's copy of the config; a Python fit's hyper-parameters
TRAJECTORY_FILE = "lens_trajectory.json"  # `layerwise lens --trajectory --out RUN`: shown when the run folder has it
FIGURE_DPI = 150  # PNG figures at print resolution, shown at their print size (CSS inches)
Figure = tuple[str, str, str, str]  # stage, name, caption, PNG as base64


def report(
    path: list[Path],
    out: Optional[Path] = None,
    step: Optional[int] = None,
    label: Optional[list[str]] = None,
    epoch: str = "last",
    width: Literal["column", "page"] = "page",
    figures: Optional[list[str]] = None,
) -> None:
    """Write one self-contained HTML report of a run (config, per-layer tables, figures, curves over training).

    No server and no network: data, figures and script are inline. A slider picks the validation (epoch, step)
    shown in the per-layer table and the per-layer charts; the PNG figures are those of one validation (--step);
    the coupling, comparison, transfer and detection sections appear when the run has them. Several runs (folders
    or globs) are compared instead: the figures of ``layerwise plot RUN...`` (a line per group of seeds, its band
    the 95 % t-interval) and their table, also written as comparison.csv and comparison.md beside the HTML.

    Args:
        path: a run folder (runs/NAME/version_N), or a folder holding runs (its run with the most validations).
            Several paths or a glob (``'runs/modes/*'``): those runs side by side.
        out: the HTML file to write (default: <run folder>/report.html; for several runs: comparison/report.html).
        step: the global step whose figures are drawn (default: the latest validation; one run).
        label: several runs: a label per run, or per path (a glob's runs share it); runs sharing a label form one
            group (default: what differs between the runs' configs: the model class, the backbone, ...).
        epoch: several runs: the epoch every run is drawn at: last (the latest every run has), best:<key> (the best
            mean of a summary key over the runs, at the last layer), or a number.
        width: print width the figures are drawn at (at 150 dpi), every text >= 7 pt: a journal's column (3.3 in)
            or page (6.9 in).
        figures: figure functions of your own analyses, as module:function (e.g. feature_norm:feature_norm_figures),
            that may draw the summaries that name them, besides the package's and those registered in the
            entry-point group layerwise.figures; a summary naming any other function draws it not (docs/security.md).
    """
    from layerwise.figures.plot import warnings_as_lines
    from layerwise.figures.registry import typed_functions
    from layerwise.results import is_pattern

    functions = typed_functions(figures or [])

    path = [Path(path)] if isinstance(path, (str, Path)) else [Path(p) for p in path]  # one path, from Python
    if len(path) > 1 or is_pattern(path[0]):
        if step is not None:
            raise ValueError("`--step` picks a validation of one run; several runs are drawn at one epoch (--epoch).")
        with warnings_as_lines("layerwise report"):
            written, runs = write_comparison_report(path, out, label, epoch, width)
        print(f"layerwise report: {runs} runs side by side")
        print(written)
        return
    if label is not None or epoch != "last":
        raise ValueError("`--label` and `--epoch` compare several runs; for one run, --step picks the validation.")
    with warnings_as_lines("layerwise report"):
        written, run = write_report(path[0], out, step, width, functions)
    print(f"layerwise report: run {run}")
    print(written)


def write_comparison_report(
    paths: list[Path],
    out: Optional[Path] = None,
    labels: Optional[list[str]] = None,
    epoch: str = "last",
    width: str = "page",
) -> tuple[Path, int]:
    """Several runs side by side in one HTML file, the table as CSV and Markdown beside it; (HTML written, runs)."""
    from layerwise.figures.overlay import comparison_figures, load_comparison, table_texts

    target = Path(out) if out is not None else Path("comparison") / "report.html"
    if target.is_dir():
        raise ValueError(f"`--out={target}` is a folder: give the HTML file to write (e.g. {target / 'report.html'}).")
    comparison = load_comparison(paths, labels, epoch)
    texts = table_texts(comparison)
    for name, text in texts.items():
        write_text_atomic(target.parent / name, text)
    from layerwise.figures.style import drawn_at

    with drawn_at(width):
        figures = [(name, _png(figure)) for name, figure in comparison_figures(comparison).items()]
    groups = "".join(
        f"<li>{_e(comparison.legend(group.label))}: {_e(', '.join(comparison.names[i] for i in group.members))}</li>"
        for group in comparison.groups
    )
    items = "".join(
        f'<figure data-figure="{_e(name)}"><img alt="{_e(caption)}" style="width:{_inches(data):.2f}in" '
        f'src="data:image/png;base64,{data}"><figcaption>{_e(caption)}</figcaption></figure>'
        for name, data in figures
        for caption in [COMPARISON_CAPTIONS[name]]
    )
    body = (
        f"<h1>layerwise report: {len(comparison.runs)} runs side by side</h1>"
        f"<p class=sub>{_e(comparison.line)}; comparison.csv and comparison.md beside this file hold the numbers</p>"
        f"<section id=groups><h2>Groups</h2><ul>{groups}</ul></section>"
        f"<section id=figures><h2>Figures</h2><div class=figs>{items}</div></section>"
        f"<section id=table><h2>Table</h2>{_markdown_tables(texts['comparison.md'])}</section>"
    )
    page = COMPARISON_TEMPLATE.format(
        csp=_e(content_security_policy()), title=_e("layerwise report: runs side by side"), style=STYLE, body=body
    )
    return write_text_atomic(target, page), len(comparison.runs)


COMPARISON_CAPTIONS = {
    "accuracy": "Accuracy of the shared head per layer",
    "cos": "COS to the last layer, per layer",
    "cka": "CKA to the last layer, per layer",
    "nc1": "NC1 per layer",
    "cdnv": "CDNV per layer",
    "nc2_equinorm": "NC2 equinorm (CV of the class-mean norms) per layer",
    "nc2_equiangular": "NC2 equiangularity per layer",
    "nc2_etf": "NC2 simplex-ETF error per layer",
    "nc3": "NC3 class means against the shared head's rows per layer",
    "nc4_agreement": "NC4 agreement of the nearest-class-centre classifier with the head per layer",
    "kl_to_final": "KL from the final layer's distribution per layer",
    "effective_depth": "ε-effective depth for each ε",
    "early_exit": "Early exit: accuracy against speedup over the thresholds τ",
}


def _markdown_tables(text: str) -> str:
    """The Markdown tables of ``comparison.md`` as HTML (its headings as h3; other lines as paragraphs)."""
    parts: list[str] = []
    rows: list[str] = []

    def flush() -> None:
        if rows:
            cells = [[cell.strip() for cell in row.strip("|").split("|")] for row in rows if "---" not in row]
            head = "".join(f"<th>{_e(cell)}</th>" for cell in cells[0])
            body = "".join("<tr>" + "".join(f"<td>{_e(cell)}</td>" for cell in row) + "</tr>" for row in cells[1:])
            parts.append(f"<table><tr>{head}</tr>{body}</table>")
            rows.clear()

    for line in text.splitlines():
        if line.startswith("|"):
            rows.append(line)
            continue
        flush()
        if line.startswith("## "):
            parts.append(f"<h3>{_e(line[3:])}</h3>")
    flush()
    return "".join(parts)


def write_report(
    path: Path, out: Optional[Path] = None, step: Optional[int] = None, width: str = "page", functions: Any = ()
) -> tuple[Path, Path]:
    """Check the options, read every summary of the run, write the HTML atomically; ``(file written, run folder)``."""
    path = Path(path)
    if path.is_file():
        raise ValueError(f"path {path} is a file: give the run folder (the one holding layerwise/).")
    files = sorted(find_summaries(path, all_epochs=True, option="path"), key=lambda f: (summary_order(f), f.name))
    run = files[0].parent.parent
    target = Path(out) if out is not None else run / "report.html"
    if target.is_dir():
        raise ValueError(f"`--out={target}` is a folder: give the HTML file to write (e.g. {target / 'report.html'}).")
    summaries = [load_summary(file) for file in files]
    steps = sorted({_order(file, summary) for file, summary in zip(files, summaries)})
    chosen = steps[-1]
    if step is not None:
        matching = [order for order in steps if order[1] == step]
        if not matching:
            have = ", ".join(str(order[1]) for order in steps)
            raise ValueError(f"`--step={step}`: the run has no validation at that step (it has steps {have}).")
        chosen = matching[-1]
    from layerwise.figures.style import drawn_at

    with drawn_at(width):
        page = build_html(run, files, summaries, chosen, functions)
    return write_text_atomic(target, page), run


def _order(file: Path, summary: dict[str, Any]) -> tuple[int, int]:
    """``(epoch, step)`` of a summary: its own keys, else its file name's."""
    epoch, step = summary_order(file)
    return int(summary.get("epoch", epoch)), int(summary.get("global_step", step))


def build_html(
    run: Path, files: list[Path], summaries: list[dict[str, Any]], chosen: tuple[int, int], functions: Any = ()
) -> str:
    """The report's HTML: ``summaries`` (read from ``files``, in order) drawn around the validation ``chosen``.

    ``functions``: figure functions besides the registered ones (:mod:`layerwise.figures.registry`).
    """
    from layerwise.figures.style import QUANTITY_COLOURS, SERIES_PALETTE, stage_name

    stages = sorted({file.name.split("_epoch_")[0] for file in files}, key=lambda s: (s != "val", s))
    records = [
        {"file": file.name, "stage": file.name.split("_epoch_")[0], "order": list(_order(file, summary))}
        for file, summary in zip(files, summaries)
    ]
    config_name, config_text = _config(run)
    depth = max((s.get("depth") or max(s.get("layers") or [0]) for s in summaries), default=0)  # layer numbers
    meta = {
        "run": str(run),
        "stages": stages,
        "records": records,
        "steps": [list(order) for order in sorted({tuple(r["order"]) for r in records})],
        "chosen": list(chosen),
        "layer_colors": layer_colors(max(depth, *(len(s.get("detection_ap50") or []) for s in summaries), 1)),
        "quantity_colors": dict(QUANTITY_COLOURS),  # one colour per quantity, the figures' (style.py)
        "series_colors": list(SERIES_PALETTE),
        "stage_names": {stage: stage_name(stage) for stage in stages},
        "probes": "LinearProbes" in config_text,
    }
    figures = _figures(stages, records, summaries, tuple(chosen), functions)
    sections = {name for summary in summaries for name in SECTION_FIGURES if summary.get(name)}
    validation_stages = [s for s in stages if s.startswith("val")]
    body = [
        f"<h1>layerwise report</h1><p class=sub>{_e(run)} · {len(files)} summaries · stages "
        f"{', '.join(_e(stage_name(s)) for s in stages)} · figures of epoch {chosen[0]}, step {chosen[1]}</p>",
        _nav(sections, len(validation_stages) > 1 or meta["probes"], (run / TRAJECTORY_FILE).is_file()),
        "<div id=bar><label for=step>validation</label> <input type=range id=step min=0 value=0> "
        "<span id=steplabel></span></div>",
        "<section id=config><h2>Config</h2>",
        f"<details open><summary>{_e(config_name)}</summary><pre>{_e(config_text)}</pre></details>"
        if config_text
        else "<p>No config.yaml or hparams.yaml beside the summaries (not a <code>layerwise fit</code> run).</p>",
        "</section>",
        "<section id=table><h2>Per layer, at the validation the slider picks</h2><div id=tables></div></section>",
        _figure_section(
            "figures",
            "Figures",
            figures.get("general", []),
            note=f"Of epoch {chosen[0]}, step {chosen[1]} (layerwise report --step S draws another validation's).",
        ),
        "<section id=curves><h2>Per-layer curves over training</h2>"
        "<p class=note>One colour per layer; the dashed line marks the validation the slider picks.</p>"
        "<div id=curvecharts></div></section>",
    ]
    if len(validation_stages) > 1 or meta["probes"]:
        note = " Accuracy is that of the linear probes on the frozen layers." if meta["probes"] else ""
        body.append(
            "<section id=transfer><h2>Transfer</h2><p class=note>Accuracy per layer on every evaluation set, at the "
            f"validation the slider picks.{note}</p><div id=transfercharts class=grid></div></section>"
        )
    trajectory = _trajectory_section(run)
    if trajectory:
        body.append(trajectory)
    titles = {"coupling": "Block coupling", "compare": "Comparison with model B", "detection_ap50": "Detection"}
    anchors = {"coupling": "coupling", "compare": "comparison", "detection_ap50": "detection"}
    for name in SECTION_FIGURES:
        if name in sections:
            body.append(
                _figure_section(anchors[name], titles[name], figures.get(name, []), charts=f"{anchors[name]}charts")
            )
    script = (Path(__file__).parent / "report.js").read_text(encoding="utf-8")
    return TEMPLATE.format(
        csp=_e(content_security_policy(script)),
        title=_e(f"layerwise report: {run.parent.name}/{run.name}"),
        style=STYLE,
        body="\n".join(body),
        summaries=_script_json(summaries),
        meta=_script_json(meta),
        script=script,
    )


def _nav(sections: set[str], transfer: bool, trajectory: bool = False) -> str:
    links = [("config", "config"), ("table", "per layer"), ("figures", "figures"), ("curves", "curves")]
    if transfer:
        links.append(("transfer", "transfer"))
    if trajectory:
        links.append(("trajectory", "trajectory"))
    for name, anchor in (("coupling", "coupling"), ("compare", "comparison"), ("detection_ap50", "detection")):
        if name in sections:
            links.append((anchor, anchor))
    return "<nav>" + " · ".join(f'<a href="#{anchor}">{text}</a>' for anchor, text in links) + "</nav>"


def _trajectory_section(run: Path) -> str:
    """The section of the prediction trajectory ``layerwise lens --trajectory --out RUN`` left in the run folder.

    Drawn from its numbers (``lens_trajectory.json``, read as data: its texts reach the page escaped); "" when there
    is none. A file that does not fit the trajectory's shape is left out with one warning line naming the key.
    """
    import warnings

    path = run / TRAJECTORY_FILE
    if not path.is_file():
        return ""
    from layerwise.figures.lens import TRAJECTORY_LABELS, check_trajectory, trajectory_figure

    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:  # json's JSONDecodeError is a ValueError
        data = f"{path}: not JSON ({error})."
    try:
        data = check_trajectory(data, str(path)) if not isinstance(data, str) else data
    except ValueError as error:
        data = str(error)
    if isinstance(data, str):
        warnings.warn(f"{data} The report leaves the prediction trajectory out.", LayerwiseWarning, stacklevel=2)
        return ""
    import matplotlib.pyplot as plt

    figure = trajectory_figure(data)
    try:
        png = _png(figure)
    finally:
        plt.close(figure)
    lenses = " and ".join(str(panel["name"]) for panel in data["lenses"])
    caption = (
        f"Prediction trajectory of the prompt {data.get('prompt', '')!r}: each layer's top next-token prediction at "
        f"every position through the {lenses}, coloured by {TRAJECTORY_LABELS[data['statistic']]}."
    )
    return (
        "<section id=trajectory><h2>Prediction trajectory</h2>"
        f"<p class=note>From {_e(TRAJECTORY_FILE)} in the run folder (layerwise lens --trajectory), which holds the "
        "numbers.</p><div class=figs>"
        f'<figure data-figure="lens_trajectory"><img alt="{_e(caption)}" style="width:{_inches(png):.2f}in" '
        f'src="data:image/png;base64,{png}"><figcaption>{_e(caption)}</figcaption></figure></div></section>'
    )


def _figure_section(anchor: str, title: str, figures: list[Figure], charts: str = "", note: str = "") -> str:
    """A section of PNG figures, one group per stage, and optionally a container for the script's charts."""
    from layerwise.figures.style import stage_name

    groups: dict[str, list[str]] = {}
    for stage, name, caption, data in figures:
        groups.setdefault(stage, []).append(
            f'<figure data-figure="{_e(name)}"><img alt="{_e(caption)}" style="width:{_inches(data):.2f}in" '
            f'src="data:image/png;base64,{data}">'
            f"<figcaption>{_e(caption)}"
            "</figcaption></figure>"
        )
    items = "".join(
        f"<h3>{_e(stage_name(stage))}</h3><div class=figs>{''.join(group)}</div>" for stage, group in groups.items()
    )
    chart_div = f"<div id={charts} class=grid></div>" if charts else ""
    empty = "" if figures or charts else "<p>No figure for this validation.</p>"
    note = f"<p class=note>{_e(note)}</p>" if note else ""
    return f"<section id={anchor}><h2>{_e(title)}</h2>{note}{chart_div}{items}{empty}</section>"


def _figures(
    stages: list[str],
    records: list[dict[str, Any]],
    summaries: list[dict[str, Any]],
    chosen: tuple[int, int],
    functions: Any = (),
) -> dict[str, list[Figure]]:
    """PNG figures per section: each stage's figures at ``chosen``; a section's latest at or before it."""
    from layerwise.figures.summary import caption

    out: dict[str, list[Figure]] = {}
    for stage in stages:
        of_stage = [(tuple(r["order"]), s) for r, s in zip(records, summaries) if r["stage"] == stage]
        at = [(r["file"], s) for r, s in zip(records, summaries) if r["stage"] == stage and tuple(r["order"]) == chosen]
        if at:
            file, summary = at[-1]
            general = {key: value for key, value in summary.items() if key not in SECTION_FIGURES}
            drawn = _encoded(general, functions, file)
            out.setdefault("general", []).extend((stage, name, caption(name), png) for name, png in drawn)
        for section in SECTION_FIGURES:
            earlier = [(order, s) for order, s in of_stage if order <= chosen and s.get(section)]
            if earlier:
                (epoch, step), summary = earlier[-1]
                drawn = _encoded({section: summary[section], "layers": summary.get("layers")})
                when = f"(epoch {epoch}, step {step})"
                out.setdefault(section, []).extend((stage, name, f"{caption(name)} {when}", png) for name, png in drawn)
    return out


def _encoded(summary: dict[str, Any], functions: Any = (), where: str = "the summary") -> list[tuple[str, str]]:
    """Every figure of ``summary`` as ``(name, PNG as base64)``; the figures closed, whatever happens."""
    import matplotlib.pyplot as plt

    from layerwise.figures.summary import summary_figures

    figures = summary_figures(summary, functions, where)
    try:
        return [(name, _png(figure)) for name, figure in figures.items()]
    finally:
        for figure in figures.values():
            plt.close(figure)


def _png(figure: Any) -> str:
    """``figure`` as a base64 PNG at :data:`FIGURE_DPI`, in 256 colours: a quarter of the bytes of full colour."""
    from PIL import Image  # matplotlib's own dependency

    drawn, buffer = io.BytesIO(), io.BytesIO()
    figure.savefig(drawn, format="png", dpi=FIGURE_DPI)
    image = Image.open(drawn).convert("RGB").quantize(colors=256, method=Image.Quantize.FASTOCTREE)
    image.save(buffer, format="png", optimize=True, dpi=(FIGURE_DPI, FIGURE_DPI))
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def _config(run: Path) -> tuple[str, str]:
    """The run's config file name and text (LightningCLI's config.yaml, else hparams.yaml), or ``("", "")``."""
    for name in CONFIG_FILES:
        if (run / name).is_file():
            return name, (run / name).read_text(encoding="utf-8", errors="replace")
    return "", ""


def layer_colors(count: int) -> list[str]:
    """One colour per layer of a ``count``-layer model, the colours of the figures (``style.layer_colour``)."""
    from matplotlib.colors import to_hex

    from layerwise.figures.style import layer_colour

    return [to_hex(layer_colour(layer, count)) for layer in range(1, count + 1)]


def _inches(data: str) -> float:
    """The print width of a base64 PNG drawn at :data:`FIGURE_DPI`: its pixel width (the IHDR chunk) over the dpi."""
    return int.from_bytes(base64.b64decode(data[:32])[16:20], "big") / FIGURE_DPI


def content_security_policy(script: Optional[str] = None) -> str:
    """The page's Content-Security-Policy: its one inline ``script`` by hash (none: no script), nothing else runs.

    No inline event handler (``onerror=...`` in a value that slipped through would not run), nothing remote: styles
    inline (the page's own ``<style>`` and the figures' widths), images as data URIs, no form, no base URL.
    """
    scripts = "'none'"
    if script is not None:
        digest = base64.b64encode(hashlib.sha256(script.encode("utf-8")).digest()).decode("ascii")
        scripts = f"'sha256-{digest}'"
    return (
        f"default-src 'none'; script-src {scripts}; style-src 'unsafe-inline'; img-src data:; base-uri 'none'; "
        "form-action 'none'"
    )


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _script_json(value: Any) -> str:
    """JSON safe inside a ``<script>`` element: every ``<`` escaped as a JSON unicode escape (the same JSON)."""
    return json.dumps(value, allow_nan=False, separators=(",", ":")).replace("<", "\\u003c")


# The page's head and body; the report of one run adds its data (JSON, read as text) and its one script
PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{{csp}}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,"><title>{{title}}</title><style>{{style}}</style></head>
<body>
{{body}}
{scripts}</body></html>
"""
COMPARISON_TEMPLATE = PAGE.format(scripts="")
TEMPLATE = PAGE.format(
    scripts="""<script type="application/json" id="summaries">{summaries}</script>
<script type="application/json" id="meta">{meta}</script>
<script>{script}</script>
"""
)

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0 auto;max-width:1280px;padding:0 16px;
color:#222;background:#fff}
h1{font-size:1.5em;margin:16px 0 2px}h2{font-size:1.2em;border-bottom:1px solid #ddd;padding-bottom:3px;margin-top:28px}
h3{font-size:1em;margin:14px 0 4px}.sub,.note{color:#555;font-size:.9em}nav{font-size:.9em;margin:6px 0}
#bar{position:sticky;top:0;background:#f6f6f6;border:1px solid #ddd;padding:6px 10px;z-index:2;font-size:.95em}
#step{width:50%;vertical-align:middle}pre{background:#f8f8f8;padding:8px;overflow:auto;max-height:420px;
font-size:.8em}table{border-collapse:collapse;font-size:.85em;margin:4px 0 10px}
th,td{border:1px solid #ddd;padding:2px 8px;text-align:right}th{background:#f0f0f0}
.figs,.grid{display:flex;flex-wrap:wrap;gap:12px}figure{margin:0}figcaption{font-size:.8em;color:#555}
.chart{border:1px solid #eee;padding:4px}.legend{font-size:.75em;max-width:400px}
.legend span{display:inline-block;margin-right:8px}.sw{display:inline-block;width:10px;height:10px;margin-right:3px}
.scalars{font-size:.85em;color:#333}
"""
