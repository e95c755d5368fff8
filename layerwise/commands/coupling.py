"""Block coupling of a model over prompts: depth-wise coupling, spectra, linearisation, trajectory shape.

The prompts, the files and the score regression of ``layerwise coupling``; the analysis itself,
:class:`~layerwise.engines.coupling.CouplingAnalysis`, is the engine it shares with the ``BlockCoupling`` callback.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Optional, Union

from layerwise.commands._lazy import ANNOTATIONS_ONLY
from layerwise.commands._options import DeviceMap, DType, ModelSource, at_least, check_layer_numbers
from layerwise.commands.configs import shipped_file
from layerwise.engines.coupling import CouplingAnalysis
from layerwise.errors import UsageError

if ANNOTATIONS_ONLY:
    pass


# ---------------------------------------------------------------------------------------------------- the command
def load_prompts(path: Any, max_prompts: int) -> list[str]:
    """Prompts from a text file (one per non-empty line) or a JSON Lines file (a ``text`` field per line).

    Raises:
        ValueError: naming ``--prompts``, when the file is missing, empty, or a JSON line has no ``text``.
    """
    import json
    from pathlib import Path

    path = Path(path)
    if not path.is_file() and (shipped := shipped_file(path)) is not None:  # configs/coupling/prompts.txt, shipped
        path = shipped
    if not path.is_file():
        raise ValueError(f"`--prompts={path}` is not a file (give a text file, one prompt per line, or .jsonl).")
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if path.suffix == ".jsonl":
        prompts = []
        for number, line in enumerate(lines, 1):
            record = json.loads(line)
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise ValueError(f"`--prompts={path}` line {number}: expected a JSON object with a 'text' string.")
            prompts.append(record["text"])
    else:
        prompts = lines
    if not prompts:
        raise ValueError(f"`--prompts={path}` holds no prompt.")
    return prompts[:max_prompts]


def load_dataset_prompts(
    dataset: str, dataset_config: Optional[str], split: str, column: str, max_prompts: int
) -> list[str]:
    """Prompts from a Hugging Face dataset (hub id or local folder): the non-empty ``column`` strings of ``split``."""
    from datasets import load_dataset

    try:
        data = load_dataset(dataset, dataset_config, split=split)
    except Exception as error:  # noqa: BLE001 - datasets raises many kinds; the user needs the flag
        raise ValueError(f"`--dataset={dataset}` (split {split!r}) could not be loaded: {error}") from None
    if column not in data.column_names:
        raise ValueError(f"`--column={column}`: the dataset's columns are {data.column_names}.")
    prompts = []
    for text in data[column]:
        if isinstance(text, str) and text.strip():
            prompts.append(text.strip())
            if len(prompts) == max_prompts:
                break
    if not prompts:
        raise ValueError(f"`--dataset={dataset}` has no non-empty {column!r} text in split {split!r}.")
    return prompts


def coupling_record(analysis: CouplingAnalysis, results: dict[str, Any]) -> dict[str, Any]:
    """The JSON record of ``results``, with the first prompt's token-wise coupling when kept."""
    from layerwise.results import to_json

    record = to_json(results)
    if analysis.token_coupling is not None:
        record["token_coupling"] = {
            "mode": analysis.token_mode,
            "blocks": [block + 1 for block in analysis.token_pair_blocks],
            "k": min(analysis.ks),
            "prompt": 0,
            "matrix": to_json(analysis.token_coupling.float()),
        }
    return record


COUPLING_JSON, CORRELATION_JSON = "coupling.json", "correlation.json"  # what `coupling` (--correlate) writes first


def write_coupling_json(analysis: CouplingAnalysis, results: dict[str, Any], out: Any) -> Any:
    """Write ``coupling.json`` (atomically) into ``out``; returns its path."""
    import json
    from pathlib import Path

    from layerwise.results import write_text_atomic

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    record = coupling_record(analysis, results)
    return write_text_atomic(out / COUPLING_JSON, json.dumps(record, indent=1) + "\n")


def coupling_files(analysis: CouplingAnalysis, results: dict[str, Any], out: Any) -> list[Any]:
    """Write ``coupling.json``, then the figures, into ``out``; returns the written paths.

    The results are on disk before any figure is drawn; the figures read float32 (a bfloat16 model's trajectory
    is converted here, numpy has no bfloat16).
    """
    from pathlib import Path

    import matplotlib.pyplot as plt

    from layerwise.figures import coupling as figures
    from layerwise.results import save_figure_atomic

    out = Path(out)
    written = [write_coupling_json(analysis, results, out)]
    record = coupling_record(analysis, results)
    drawn = figures.coupling_figures(record)
    if analysis.token_coupling is not None:
        drawn["coupling_tokens"] = figures.token_coupling(
            analysis.token_coupling.float(), analysis.token_pair_blocks, min(analysis.ks), analysis.token_mode
        )
    if analysis.example_trajectory is not None:
        drawn["coupling_pca"] = figures.trajectory_pca(analysis.example_trajectory.float())
    for stem, figure in drawn.items():
        try:
            written.append(save_figure_atomic(out / f"{stem}.png", figure))
        finally:
            plt.close(figure)
    return written


def correlate_scores(table: Any, score_column: Optional[str], k: Optional[int]) -> dict[str, Any]:
    """Linear regression of a benchmark score on the models' coupling scores (the paper's headline analysis).

    ``table`` is a CSV file with a ``coupling_json`` column (paths to ``coupling.json`` files, relative to the
    CSV), an optional ``name`` column and one or more score columns (``score_column``, default the first other
    column). ``k`` picks the coupling score of that K (default: the first K of each file).

    Returns ``slope``, ``intercept``, ``r2``, ``p_value`` (two-sided, of the slope), ``n`` and the points.
    """
    import csv
    from pathlib import Path

    from scipy.stats import linregress

    table = Path(table)
    if not table.is_file():
        raise ValueError(f"`--correlate={table}` is not a file (a CSV with coupling_json and score columns).")
    with table.open(newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    columns = list(rows[0]) if rows else []
    if "coupling_json" not in columns:
        raise ValueError(f"`--correlate={table}` needs a 'coupling_json' column; it has {columns}.")
    candidates = [column for column in columns if column not in ("coupling_json", "name")]
    column = score_column or (candidates[0] if candidates else None)
    if column not in candidates:
        raise ValueError(f"`--score_column={column}` is not a score column of {table} (columns: {candidates}).")
    if len(rows) < 3:
        raise ValueError(f"`--correlate={table}` has {len(rows)} models; a regression with a p-value needs 3 or more.")
    names, x, y = [], [], []
    for row in rows:
        path = (table.parent / row["coupling_json"]).resolve()
        x.append(_coupling_score(path, k))
        y.append(float(row[column]))
        names.append(row.get("name") or Path(row["coupling_json"]).parent.name)
    fit = linregress(x, y)
    return {
        "score_column": column,
        "k": k,
        "n": len(x),
        "slope": float(fit.slope),
        "intercept": float(fit.intercept),
        "r2": float(fit.rvalue**2),
        "p_value": float(fit.pvalue),
        "points": [{"name": n, "coupling": xi, "score": yi} for n, xi, yi in zip(names, x, y)],
    }


def _coupling_score(path: Path, k: Optional[int]) -> float:
    """The coupling score at ``k`` (the first K without one) of a coupling JSON, read as data: one line if not."""
    try:
        coupling = json.loads(path.read_text(encoding="utf-8"))
        ks = list(coupling["ks"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as error:
        raise ValueError(
            f"{path} is not a readable coupling JSON ({type(error).__name__}: {str(error)[:120]})."
        ) from None
    if k is not None and k not in ks:
        raise ValueError(f"`--k={k}`: {path} has coupling scores for K in {ks[:20]}.")
    try:
        return float(coupling["coupling_score"][ks.index(k) if k is not None else 0])
    except (KeyError, IndexError, TypeError, ValueError):
        raise ValueError(f"{path}: `coupling_score` must be a list of numbers, one per K in `ks`.") from None


# ------------------------------------------------------------------------------- the `layerwise coupling` command
def check_coupling_options(
    prompts: bool,
    dataset: bool,
    max_prompts: int,
    max_tokens: int,
    ks: Sequence[int],
    chunk_size: Optional[int],
    token_blocks: Optional[Sequence[int]],
) -> None:
    """The checks of ``coupling``'s options before any model is loaded, each error naming its flag."""
    if prompts == dataset:
        raise ValueError("Give --prompts (a text file, one prompt per line) or --dataset, or --correlate scores.csv.")
    if max_prompts < 1 or max_tokens < 2:
        raise ValueError("`--max_prompts` must be >= 1 and `--max_tokens` >= 2.")
    if not ks or min(ks) < 1:
        raise ValueError(f"`--ks={ks}` must be positive ints.")
    if chunk_size is not None:
        at_least("chunk_size", chunk_size, 1)
    if token_blocks is not None and len(token_blocks) != 2:
        raise ValueError(f"`--token_blocks={token_blocks}` must be two block numbers.")


def tokenized_prompts(
    texts: Sequence[str], tokenizer: Any, max_tokens: int, tokens: Any, flag: str
) -> list[dict[str, Any]]:
    """Every prompt tokenized (at most ``max_tokens``), each checked to have 2 tokens and the ``--tokens`` index."""
    batches = []
    for number, text in enumerate(texts, 1):
        batch = tokenizer(text, return_tensors="pt", truncation=True, max_length=max_tokens)
        length = batch["input_ids"].shape[1]
        if length < 2:
            raise UsageError(f"`{flag}`: prompt {number} ({text!r}) has fewer than 2 tokens; remove it.")
        if isinstance(tokens, int) and not -length <= tokens < length:
            raise UsageError(
                f"`--tokens={tokens}`: prompt {number} of `{flag}` has {length} tokens (index {-length} to "
                f"{length - 1}); give a smaller index, or first/last."
            )
        batches.append(dict(batch))
    return batches


def coupling(
    prompts: Optional[Path] = None,
    dataset: Optional[str] = None,
    dataset_config: Optional[str] = None,
    split: str = "validation",
    column: str = "text",
    model: Optional[str] = None,
    checkpoint: Optional[Path] = None,
    tokenizer: Optional[str] = None,
    tokenizer_dir: Optional[Path] = None,
    max_prompts: int = 64,
    max_tokens: int = 64,
    tokens: Union[Literal["last", "first"], int] = "last",
    ks: list[int] = [10, 30, 50],  # noqa: B006 (jsonargparse reads the default from the signature)
    form: Literal["code", "offdiag"] = "code",
    method: Literal["full", "randomized"] = "full",
    token_blocks: Optional[list[int]] = None,
    token_mode: Literal["self", "fixed_input", "fixed_output"] = "self",
    dtype: DType = "auto",
    device: Optional[str] = None,
    device_map: DeviceMap = None,
    offload_folder: Optional[Path] = None,
    chunk_size: Optional[int] = None,
    correlate: Optional[Path] = None,
    score_column: Optional[str] = None,
    k: Optional[int] = None,
    out: Path = Path("coupling"),
    overwrite: bool = False,
) -> None:
    """Block coupling of a causal LM over prompts (Aristide et al., 2024), or the regression of scores on it.

    Writes coupling.json and figures (depth-wise mis-coupling per K, spectra, step norms, token-wise coupling of
    two blocks, trajectory PCA) into --out. With --correlate, reads several models' coupling.json files and a
    table of benchmark scores and fits score = a + b * coupling (slope, R², p-value, scatter plot).

    Args:
        prompts: a text file (one prompt per line) or a .jsonl file with a 'text' field per line.
        dataset: instead of --prompts, a Hugging Face dataset (hub id or local folder).
        dataset_config: its configuration name.
        split: the dataset split to read.
        column: the dataset column holding the text.
        model: a Hugging Face causal LM: hub name or local folder.
        checkpoint: a layerwise Lightning checkpoint (.ckpt) of a causal LM.
        tokenizer: as for generate; default: --model (required with --checkpoint).
        tokenizer_dir: folder holding trained tokenizers (the data cache_dir).
        max_prompts: use at most this many prompts.
        max_tokens: truncate each prompt to this many tokens.
        tokens: the token whose Jacobians are taken: last, first or an index.
        ks: numbers K of top singular vectors.
        form: mis-coupling form: code (the authors') or offdiag.
        method: full SVD, or randomized (checked; falls back to full with a warning).
        token_blocks: two block numbers (1..L) for the token-wise heatmap of the first prompt (default: 1 and L).
        token_mode: token-wise coupling: self (J_tt against J_t't'), fixed_input (from token 0 to every output) or
            fixed_output (from every input to the last token).
        dtype: load the model in this dtype (auto: as saved); Jacobians are float32 (float64 for float64).
        device: cpu, cuda, cuda:1, ... (default: cuda when available); ignored with --device_map.
        device_map: spread the model over devices as it loads: auto (every GPU, then the CPU, then the disk) or a
            JSON object from module name to cpu, a GPU index or disk (accelerate); offloaded blocks are loaded one
            at a time for their Jacobians.
        offload_folder: where weights offloaded to disk are kept.
        chunk_size: JVPs run at once per block (default all d); lower it to bound the memory of wide models.
        correlate: a CSV with coupling_json (paths) and score columns: fit the regression instead.
        score_column: the score column of --correlate (default: the first).
        k: the K whose coupling score --correlate uses (default: the first K of each file).
        out: output folder.
        overwrite: replace the results of an earlier run in --out (without it, the command stops at them).
    """
    from layerwise.results import check_outputs_free

    check_outputs_free(out, [CORRELATION_JSON if correlate is not None else COUPLING_JSON], overwrite)
    if correlate is not None:
        _correlate(correlate, score_column, k, out)
        return
    from tqdm.auto import tqdm

    check_coupling_options(
        prompts is not None, dataset is not None, max_prompts, max_tokens, ks, chunk_size, token_blocks
    )
    texts = (
        load_prompts(prompts, max_prompts)
        if prompts is not None
        else load_dataset_prompts(dataset, dataset_config, split, column, max_prompts)
    )
    lm, tokenizer_object, total = ModelSource(
        checkpoint, model, tokenizer, tokenizer_dir, dtype, device_map, offload_folder
    ).load_on(device)
    if max(ks) > lm.config.hidden_size:
        raise ValueError(f"`--ks={ks}`: every K must be at most the model width d={lm.config.hidden_size}.")
    pair = [1, total] if token_blocks is None else token_blocks
    check_layer_numbers("--token_blocks", pair, total)
    pair_blocks = (pair[0] - 1, pair[1] - 1)
    analysis = CouplingAnalysis(
        lm, ks, tokens, form, method, token_pair_blocks=pair_blocks, chunk_size=chunk_size, token_mode=token_mode
    )
    flag = "--prompts" if prompts is not None else "--dataset"
    batches = tokenized_prompts(texts, tokenizer_object, max_tokens, tokens, flag)  # all checked before any Jacobian
    source = str(prompts) if prompts is not None else f"{dataset}:{split}:{column}"
    header = {"model": model or str(checkpoint), "prompts": source, "max_tokens": max_tokens}
    for number, batch in enumerate(tqdm(batches, desc="prompts", unit="prompt"), 1):
        analysis.add(batch)
        done = number == len(batches)
        # the running mean is on disk after every prompt: a crash at prompt n keeps the first n - 1
        write_coupling_json(analysis, {**header, **analysis.results(), "complete": done}, out)
    results = analysis.results()
    record = {**header, **results, "complete": True}
    scores = ", ".join(f"K={kk}: {float(v):.4f}" for kk, v in zip(ks, results["coupling_score"]))
    print(f"coupling score over {results['num_prompts']} prompts: {scores}")
    print(
        f"LSS {float(results['trajectory_lss']):.4f}, expodistance {float(results['trajectory_expodistance']):.4f},"
        f" linearisation cosine {float(results['linearisation_cosine']):.4f}"
    )
    for written in coupling_files(analysis, record, out):
        print(written)


def _correlate(table: Path, score_column: Optional[str], k: Optional[int], out: Path) -> None:
    import matplotlib.pyplot as plt

    from layerwise.figures.coupling import correlation
    from layerwise.results import save_figure_atomic, write_text_atomic

    fit = correlate_scores(table, score_column, k)
    out.mkdir(parents=True, exist_ok=True)
    print(
        f"{fit['score_column']} = {fit['intercept']:.4g} + {fit['slope']:.4g} * coupling  "
        f"(R² {fit['r2']:.3f}, p {fit['p_value']:.3g}, n {fit['n']})"
    )
    paths = [write_text_atomic(out / CORRELATION_JSON, json.dumps(fit, indent=1) + "\n")]
    points = fit["points"]
    figure = correlation(
        [p["coupling"] for p in points],
        [p["score"] for p in points],
        [p["name"] for p in points],
        fit,
        f"coupling score (K={k or 'first'})",
        fit["score_column"],
    )
    try:
        paths.append(save_figure_atomic(out / "correlation.png", figure))
    finally:
        plt.close(figure)
    for path in paths:
        print(path)
