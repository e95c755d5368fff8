"""The one ``layerwise`` command line.

``fit``, ``validate``, ``test`` and ``predict`` are :class:`LayerwiseCLI` (LightningCLI); ``plot``, ``export``,
``sweep``, ``generate`` and ``lens`` are the typed functions below, each turned into a jsonargparse parser from its
signature and docstring: ``--snake_case`` flags, ``--help``, ``--config FILE`` and ``--print_config`` for every
command, and one error style (usage, then ``error: ...`` naming the flag, exit code 2).
"""

import inspect
import json
import logging
import os
import re
import sys
import typing
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, NoReturn, Optional, Union

from jsonargparse import ActionConfigFile, ArgumentParser
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from layerwise.callbacks.progress import ProgressLines
from layerwise.figures.report import report
from layerwise.inference.generation import Strategy, check_generation_options, generate_from_layer, num_blocks
from layerwise.inference.models import load_causal_lm, load_tokenizer_spec
from layerwise.lightning_modules import LayerwiseModule
from layerwise.lightning_modules.base import check_data_compatible
from layerwise.lightning_modules.checkpoint import load_module
from layerwise.results import find_summaries, latest_summary, load_summary, save_figure_atomic, write_text_atomic

FigureFormat = Literal["png", "pdf", "svg"]
# accelerate's placement of a Hugging Face model: "auto", or module name -> "cpu", a GPU index or "disk"
DeviceMap = Optional[Union[str, dict[str, Union[str, int]]]]
DType = Literal["auto", "float32", "bfloat16", "float16", "float64"]


DEBUG_VARIABLE = "LAYERWISE_DEBUG"


def concise_error(message: str) -> str:
    """The one line of a jsonargparse error that a user needs: the option and what was wrong with its value."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    own = [line.lstrip("- ") for line in lines if "`--" in line]  # layerwise's own messages name the flag
    if own:
        return own[0]
    keys = re.findall(r'Parser key "([^"]+)"', message)
    reasons = [line for line in lines if not line.startswith(("Parser key", "Does not validate", "Subtypes", "Errors"))]
    reasons = [line.lstrip("- ") for line in reasons if not line.startswith(("- Expected a <class 'NoneType'>",))]
    reason = next(
        (line for line in reasons if "Expected" in line or "Got value" in line), reasons[0] if reasons else ""
    )
    if not keys:
        return reason or lines[0]
    nested = len(keys) > 1 and "class_path" in message
    option = f"--{keys[0]}.init_args.{'.'.join(keys[1:])}" if nested else f"--{'.'.join(keys)}"
    return f"{option}: {reason}"


class _ConciseArgumentParser(LightningArgumentParser):
    """LightningCLI's parser, with errors cut to one line naming the option (the whole of it with LAYERWISE_DEBUG=1)."""

    def error(self, message: str, ex: Optional[Exception] = None) -> NoReturn:
        if os.environ.get(DEBUG_VARIABLE) or not getattr(self, "exit_on_error", True):
            super().error(message, ex)
        if "Problems parsing config" in message:
            message = f"{_bad_config_file()}{message}"
        exit_concisely(self.prog.replace(" [options]", ""), message)


def _bad_config_file() -> str:
    """``--config FILE: `` for the first config file on the command line that is not valid YAML, else ``""``."""
    import yaml

    argv = sys.argv[1:]
    for flag, value in zip(argv, argv[1:] + [""]):
        path = value if flag in ("--config", "-c") else flag.partition("=")[2] if flag.startswith("--config=") else ""
        if path and Path(path).is_file():
            try:
                yaml.safe_load(Path(path).read_text())
            except yaml.YAMLError as error:
                mark = getattr(error, "problem_mark", None)
                where = f" (line {mark.line + 1})" if mark is not None else ""
                return f"`--config {path}` is not valid YAML{where}: "
    return ""


def exit_concisely(prog: str, message: str, parsed: bool = True) -> NoReturn:
    """Print the one line of ``message`` that names the option, and where the rest is; exit with code 2.

    ``parsed=False`` for a command's own error (already one sentence naming the flag): its first line as it is.
    """
    lines = [line for line in message.strip().splitlines() if line.strip()] or [message]
    sys.stderr.write(
        f"{prog}: error: {concise_error(message) if parsed else lines[0]}\n"
        f"(options: {prog} --help; the whole message: {DEBUG_VARIABLE}=1 {prog} ...)\n"
    )
    sys.exit(2)


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
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault("parser_class", _ConciseArgumentParser)
        if not sys.stdout.isatty():  # a log file shows a bar only at the end: plain lines instead (see after_...)
            kwargs["trainer_defaults"] = {"enable_progress_bar": False, **(kwargs.get("trainer_defaults") or {})}
        super().__init__(*args, **kwargs)

    def after_instantiate_classes(self) -> None:
        """Without a terminal and without a progress bar, a fit prints progress as plain lines."""
        super().after_instantiate_classes()
        trainer = getattr(self, "trainer", None)
        if trainer is None or sys.stdout.isatty() or trainer.progress_bar_callback is not None:
            return
        if self.subcommand == "fit" and not any(isinstance(c, ProgressLines) for c in trainer.callbacks):
            trainer.callbacks.append(ProgressLines())

    @contextmanager
    def _errors_in_one_line(self, kinds: tuple[type[Exception], ...]) -> Iterator[None]:
        """A bad value found by a class itself (not by the parser) ends in one line naming the flag, too."""
        try:
            yield
        except kinds as error:
            if os.environ.get(DEBUG_VARIABLE):
                raise
            exit_concisely(f"layerwise {self.subcommand or ''}".strip(), str(error))

    def instantiate_classes(self) -> None:
        """Instantiate as LightningCLI does; a bad value found by a class itself ends in one line naming the flag."""
        with self._errors_in_one_line((ValueError, TypeError)):
            super().instantiate_classes()

    def _check_before_run(self) -> None:
        # Before the Trainer creates log folders or touches data: a bad combination leaves nothing behind.
        if isinstance(self.model, LayerwiseModule):
            with self._errors_in_one_line((ValueError,)):
                check_data_compatible(self.model, self.datamodule)

    def before_fit(self) -> None:
        self._check_before_run()

    def before_validate(self) -> None:
        self._check_before_run()

    def before_test(self) -> None:
        self._check_before_run()

    def before_predict(self) -> None:
        self._check_before_run()


# --------------------------------------------------------------------------------------------- the other commands
def plot(path: Path, out: Optional[Path] = None, all_epochs: bool = False, format: list[FigureFormat] = None) -> None:  # noqa: A002
    """Render the paper-style figures of layerwise summaries to PNG/PDF/SVG.

    COS/CKA heatmaps, similarity to the last layer with the accuracy per layer, the saturation histogram, exits per
    layer and the ε-effective depth.

    Args:
        path: a val_epoch_EEE.json file, or a log directory to search (its latest run).
        out: output folder (default: <json folder>/figures).
        all_epochs: plot every epoch, not only the latest.
        format: figure formats (default png pdf).
    """
    from layerwise.figures.plot import plot_summary

    files = find_summaries(path, all_epochs, option="path")
    if path.is_dir():
        print(f"layerwise plot: run {files[0].parent.parent}")
    for summary_file in files:
        for written in plot_summary(summary_file, out, tuple(format or ("png", "pdf"))):
            print(written)


def export(
    checkpoint: Path,
    out: Path,
    depth: Optional[int] = None,
    summary: Optional[Path] = None,
    epsilon: float = 0.01,
    relative: bool = False,
    verify: bool = True,
) -> None:
    """Export the first d blocks plus the shared head of a layerwise checkpoint as a standalone model.

    Writes OUT/model_depth_<d>.pt (torch.save of the nn.Module) and, for Hugging Face models, OUT/hf_depth_<d>/
    (save_pretrained).

    Args:
        checkpoint: a layerwise Lightning checkpoint (.ckpt).
        out: output folder.
        depth: layers to keep, 1..L (default: from --summary).
        summary: a val_epoch_EEE.json or a log directory: choose --depth as its ε-effective depth.
        epsilon: ε of the effective depth.
        relative: ε relative to the last layer's accuracy.
        verify: check on a random input that the export reproduces the shared head's layer-d logits.
    """
    from layerwise.inference.export import backbone_of, check_depth, choose_depth, export_truncated

    if depth is None and summary is None:
        raise ValueError(
            "Give --depth (layers to keep), or --summary to use the ε-effective depth of a validation run."
        )
    if depth is not None and depth < 1:
        raise ValueError(f"`--depth={depth}` must be a layer number >= 1.")
    if not 0.0 < epsilon <= 1.0:
        raise ValueError(f"`--epsilon={epsilon}` must lie in (0, 1].")
    suggestion = None
    if summary is not None:
        summary_file = latest_summary(summary, "--summary")
        content = load_summary(summary_file)
        print(f"layerwise export: summary {summary_file}")
        if not isinstance(content, dict) or not content.get("accuracy"):
            raise ValueError(
                f"`--summary={summary_file}`: no per-layer `accuracy` (validate with the analysis callbacks)."
            )
        suggestion = (*choose_depth(content, epsilon, relative), summary_file, content.get("depth"))
    module = load_module(checkpoint)
    total = backbone_of(module).num_layers
    if suggestion is not None:
        suggested, reason, summary_file, summary_layers = suggestion
        if summary_layers is not None and summary_layers != total:
            raise ValueError(
                f"`--summary={summary_file}` is of a {summary_layers}-layer model; the checkpoint has {total}."
            )
        if depth is None:
            depth = suggested
            print(f"layerwise export: depth {depth} of {total} from {summary_file}: {reason}.")
        else:
            print(f"layerwise export: --summary suggests depth {suggested} ({reason}); exporting --depth {depth}.")
    check_depth(depth, total)
    result = export_truncated(module, depth, out, verify=verify)
    print(f"{result.checkpoint}  (model = torch.load(path, weights_only=False).eval(); {depth} of {total} blocks)")
    if result.hf_folder is not None:
        print(f"{result.hf_folder}  (from_pretrained(folder) with the model's Auto class)")
    if result.max_difference is not None:
        print(f"checked: max |logit difference| to the shared head at layer {depth}: {result.max_difference:.3g}")


def sweep(
    runs: list[Path],
    labels: Optional[list[str]] = None,
    out: Path = Path("."),
    format: list[FigureFormat] = None,  # noqa: A002
) -> None:
    """Accuracy against speedup of confidence-threshold early exit, from the latest validation summary of each run.

    The shared head of every run, and the separate exit heads of multi-exit runs; writes sweep.md, sweep.csv and
    the figure.

    Args:
        runs: log directories or summary JSON files (RUN_OR_JSON).
        labels: one name per run (default: the run folder names).
        out: output folder.
        format: figure formats (default png pdf).
    """
    from layerwise.inference.sweep import load_curves, run_label, sweep_markdown, write_sweep

    if labels is not None and len(labels) != len(runs):
        raise ValueError(f"`--labels` has {len(labels)} names for {len(runs)} RUN_OR_JSON paths; give one each.")
    files = [latest_summary(path, "RUN_OR_JSON") for path in runs]
    for path, summary_file in zip(runs, files):
        print(f"layerwise sweep: {path} -> {summary_file}")
    curves = [
        curve
        for summary_file, label in zip(files, labels or [run_label(path) for path in runs])
        for curve in load_curves(summary_file, label)
    ]
    print(sweep_markdown(curves), end="")
    for written in write_sweep(curves, out, format or ("png", "pdf")):
        print(written)


def model_tokenizer(model: Optional[str]) -> Optional[str]:
    """The tokenizer a model's own name implies: the one a TransformerLens checkpoint's config names, else the name."""
    from layerwise.features.transformer_lens import legacy_config

    legacy = legacy_config(model) if model else None
    return str(legacy["tokenizer_name"]) if legacy and legacy.get("tokenizer_name") else model


def _load_for_text(
    checkpoint: Optional[Path],
    model: Optional[str],
    tokenizer: Optional[str],
    tokenizer_dir: Optional[Path],
    dtype: Optional[str] = None,
    device_map: "DeviceMap" = None,
    offload_folder: Optional[Path] = None,
) -> tuple[Any, Any, int]:
    if (checkpoint is None) == (model is None):
        raise ValueError("Give exactly one of --checkpoint (a layerwise checkpoint) and --model (a Hugging Face LM).")
    if checkpoint is not None and tokenizer is None:
        raise ValueError("--tokenizer is required with --checkpoint (e.g. --tokenizer byte, as the model was trained).")
    tokenizer_object = load_tokenizer_spec(tokenizer or model_tokenizer(model), tokenizer_dir)
    lm = load_causal_lm(checkpoint, model, dtype, device_map, offload_folder)
    return lm, tokenizer_object, num_blocks(lm, "--checkpoint" if checkpoint is not None else "--model")


def _check_layer_numbers(flag: str, layers: list[int], total: Optional[int] = None) -> None:
    for layer in layers:
        if layer < 1 or (total is not None and layer > total):
            bound = f"1..{total}" if total is not None else "1..L"
            raise ValueError(f"`{flag}` holds {layer}: layers are numbered {bound}.")


def generate(
    prompt: str,
    checkpoint: Optional[Path] = None,
    model: Optional[str] = None,
    tokenizer: Optional[str] = None,
    tokenizer_dir: Optional[Path] = None,
    layer: Optional[int] = None,
    layers: Optional[list[int]] = None,
    max_new_tokens: int = 32,
    strategy: Strategy = "greedy",
    top_k: int = 50,
    top_p: float = 0.9,
    temperature: float = 1.0,
    num_beams: int = 4,
    stop_strings: Optional[list[str]] = None,
    seed: int = 0,
    out: Optional[Path] = None,
) -> None:
    """Continue a prompt with blocks 1..l and the model's own final norm + LM head (Hugging Face's generate).

    Args:
        prompt: the text to continue.
        checkpoint: a layerwise Lightning checkpoint (.ckpt) of a causal LM.
        model: a Hugging Face causal LM: hub name or local folder.
        tokenizer: 'byte', 'bpe:N', 'wordpiece:N' (trained ones are found in --tokenizer_dir), a hub name or a
            folder; default: --model (required with --checkpoint).
        tokenizer_dir: folder holding trained tokenizers (the data cache_dir).
        layer: generate from this layer, 1..L (default: L, the full model).
        layers: generate from each of these layers, 1..L.
        max_new_tokens: tokens to generate.
        strategy: greedy, top_k, nucleus or beam.
        top_k: tokens kept by top_k.
        top_p: probability mass kept by nucleus.
        temperature: divides the logits when sampling.
        num_beams: beams of beam.
        stop_strings: stop a text once it ends with one of these.
        seed: sampling seed; every layer starts from it.
        out: also write the prompt, options and texts to this JSON file.
    """
    if layer is not None and layers:
        raise ValueError("Give --layer or --layers, not both.")
    if not prompt:
        raise ValueError("`--prompt` is empty; give the text to continue.")
    _check_layer_numbers("--layers", layers or [])
    check_generation_options(max_new_tokens, strategy, top_k, top_p, temperature, layer, num_beams)
    lm, tokenizer_object, total = _load_for_text(checkpoint, model, tokenizer, tokenizer_dir)
    _check_layer_numbers("--layers" if layers else "--layer", layers or ([layer] if layer else []), total)
    prompt_ids = tokenizer_object(prompt, return_tensors="pt")["input_ids"]
    results = []
    for number in layers or [layer or total]:
        ids = generate_from_layer(
            lm,
            prompt_ids,
            number,
            max_new_tokens,
            strategy=strategy,
            top_k=top_k,
            top_p=top_p,
            temperature=temperature,
            num_beams=num_beams,
            seed=seed,
            eos_token_id=tokenizer_object.eos_token_id,
            stop_strings=stop_strings,
            tokenizer=tokenizer_object,
        )[0].tolist()
        text = tokenizer_object.decode(ids, skip_special_tokens=True)
        results.append({"layer": number, "token_ids": ids, "text": text})
        print(f"--- layer {number}/{total} ---\n{prompt}{text}")
    if out is not None:
        options = dict(
            strategy=strategy, top_k=top_k, top_p=top_p, temperature=temperature, num_beams=num_beams, seed=seed
        )
        record = {"prompt": prompt, "num_layers": total, "max_new_tokens": max_new_tokens, **options}
        write_text_atomic(out, json.dumps({**record, "results": results}, indent=2) + "\n")
        print(out)


def lens(
    prompt: str,
    checkpoint: Optional[Path] = None,
    model: Optional[str] = None,
    tokenizer: Optional[str] = None,
    tokenizer_dir: Optional[Path] = None,
    layers: Optional[list[int]] = None,
    max_new_tokens: int = 32,
    dtype: DType = "auto",
    device_map: DeviceMap = None,
    offload_folder: Optional[Path] = None,
    out: Path = Path("."),
) -> None:
    """What the shared head predicts from every layer at every position the full model generates greedily.

    Writes lens.md and lens.png with the token and probability of every layer at every generated position.

    Args:
        prompt: the text to continue.
        checkpoint: a layerwise Lightning checkpoint (.ckpt) of a causal LM.
        model: a Hugging Face causal LM: hub name or local folder.
        tokenizer: as for generate; default: --model (required with --checkpoint).
        tokenizer_dir: folder holding trained tokenizers (the data cache_dir).
        layers: rows to show, layer numbers 1..L (default: all).
        max_new_tokens: tokens to generate.
        dtype: load --model in this dtype (default as saved).
        device_map: spread --model over devices as it loads: auto (every GPU, then the CPU, then the disk) or a
            JSON object from module name to cpu, a GPU index or disk (accelerate).
        offload_folder: where weights offloaded to disk are kept.
        out: folder for lens.md and lens.png.
    """
    from layerwise.inference.lens import lens_markdown, lens_table, write_lens

    if not prompt:
        raise ValueError("`--prompt` is empty; give the text to continue.")
    _check_layer_numbers("--layers", layers or [])
    check_generation_options(max_new_tokens, "greedy", 1, 1.0, 1.0)
    lm, tokenizer_object, total = _load_for_text(
        checkpoint, model, tokenizer, tokenizer_dir, dtype, device_map, offload_folder
    )
    _check_layer_numbers("--layers", layers or [], total)
    rows = None if layers is None else [number - 1 for number in layers]
    table = lens_table(lm, tokenizer_object, prompt, max_new_tokens, rows)
    print(lens_markdown(table))
    for written in write_lens(table, out):
        print(written)


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
    """
    if correlate is not None:
        _correlate(correlate, score_column, k, out)
        return
    from tqdm.auto import tqdm

    from layerwise.inference.coupling import CouplingAnalysis, coupling_files, load_dataset_prompts, load_prompts

    if (prompts is None) == (dataset is None):
        raise ValueError("Give --prompts (a text file, one prompt per line) or --dataset, or --correlate scores.csv.")
    if max_prompts < 1 or max_tokens < 2:
        raise ValueError("`--max_prompts` must be >= 1 and `--max_tokens` >= 2.")
    if not ks or min(ks) < 1:
        raise ValueError(f"`--ks={ks}` must be positive ints.")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"`--chunk_size={chunk_size}` must be >= 1.")
    if token_blocks is not None and len(token_blocks) != 2:
        raise ValueError(f"`--token_blocks={token_blocks}` must be two block numbers.")
    texts = (
        load_prompts(prompts, max_prompts)
        if prompts is not None
        else load_dataset_prompts(dataset, dataset_config, split, column, max_prompts)
    )
    lm, tokenizer_object, total = _load_for_coupling(
        checkpoint, model, tokenizer, tokenizer_dir, dtype, device, device_map, offload_folder
    )
    if max(ks) > lm.config.hidden_size:
        raise ValueError(f"`--ks={ks}`: every K must be at most the model width d={lm.config.hidden_size}.")
    pair = [1, total] if token_blocks is None else token_blocks
    _check_layer_numbers("--token_blocks", pair, total)
    pair_blocks = (pair[0] - 1, pair[1] - 1)
    analysis = CouplingAnalysis(
        lm, ks, tokens, form, method, token_pair_blocks=pair_blocks, chunk_size=chunk_size, token_mode=token_mode
    )
    for text in tqdm(texts, desc="prompts", unit="prompt"):
        batch = tokenizer_object(text, return_tensors="pt", truncation=True, max_length=max_tokens)
        if batch["input_ids"].shape[1] < 2:
            raise ValueError(f"The prompt {text!r} has fewer than 2 tokens; remove it from --prompts.")
        analysis.add(dict(batch))
    results = analysis.results()
    source = str(prompts) if prompts is not None else f"{dataset}:{split}:{column}"
    record = {"model": model or str(checkpoint), "prompts": source, "max_tokens": max_tokens, **results}
    scores = ", ".join(f"K={kk}: {float(v):.4f}" for kk, v in zip(ks, results["coupling_score"]))
    print(f"coupling score over {results['num_prompts']} prompts: {scores}")
    print(
        f"LSS {float(results['trajectory_lss']):.4f}, expodistance {float(results['trajectory_expodistance']):.4f},"
        f" linearisation cosine {float(results['linearisation_cosine']):.4f}"
    )
    for written in coupling_files(analysis, record, out):
        print(written)


def _check_text_source(text: Optional[list[Path]], dataset: Optional[str]) -> None:
    if (text is None) == (dataset is None):
        raise ValueError("Give exactly one of --text (local files) and --dataset (a hub dataset id).")
    for path in text or []:
        if not Path(path).is_file():
            raise ValueError(f"`--text={path}` is not a file.")


def _text_data(
    text: Optional[list[Path]],
    dataset: Optional[str],
    dataset_config: Optional[str],
    tokenizer: str,
    tokenizer_dir: Optional[Path],
    block_size: int,
    batch_size: int,
    max_train_blocks: Optional[int],
    max_val_blocks: Optional[int],
    stage: str,
) -> Any:
    """The packed text blocks ``compare`` and ``stitch`` read (``TextDataModule``: held-out tail of --text)."""
    from layerwise.datamodules import TextDataModule

    _check_text_source(text, dataset)
    data = TextDataModule(
        dataset=dataset,
        dataset_config=dataset_config,
        train_files=[str(path) for path in text] if text else None,
        tokenizer=tokenizer,
        tokenizer_dir=str(tokenizer_dir) if tokenizer_dir else None,
        block_size=block_size,
        batch_size=batch_size,
        max_train_blocks=max_train_blocks,
        max_val_blocks=max_val_blocks,
    )
    data.prepare_data()
    data.setup(stage)
    return data


def compare(
    model_a: str,
    model_b: str,
    text: Optional[list[Path]] = None,
    dataset: Optional[str] = None,
    dataset_config: Optional[str] = None,
    tokenizer: Optional[str] = None,
    tokenizer_dir: Optional[Path] = None,
    block_size: int = 256,
    batch_size: int = 8,
    max_blocks: int = 64,
    include_embeddings: bool = False,
    minibatch: bool = False,
    chunk: int = 1024,
    pairs: Literal["all", "diagonal"] = "all",
    dtype: Optional[Literal["float32", "bfloat16", "float16", "float64"]] = None,
    device: Optional[str] = None,
    device_map: DeviceMap = None,
    offload_folder: Optional[Path] = None,
    out: Path = Path("compare"),
) -> None:
    """CKA between every layer of two models on the same tokens, and their arccos distance (Brown et al., 2023).

    Both models read the held-out blocks of a text (the last 10 % of --text, packed into --block_size tokens, as
    TextDataModule does) or of a hub dataset; writes compare.json and compare_cka.png into --out.

    Args:
        model_a: hub id, folder or layerwise checkpoint of model A.
        model_b: the same for model B (it must read the same token ids).
        text: local text files (their last 10 % is read).
        dataset: a hub dataset id instead of --text (its validation split).
        dataset_config: its configuration name.
        tokenizer: 'byte', 'bpe:N', 'wordpiece:N', a hub name or a folder (default: --model_a's; for a
            TransformerLens checkpoint, the one its config names).
        tokenizer_dir: folder holding trained tokenizers.
        block_size: tokens per block.
        batch_size: blocks per batch.
        max_blocks: read at most this many blocks.
        include_embeddings: also compare the embedding outputs (layer 0).
        minibatch: also compute the unbiased minibatch CKA (chunks of --chunk tokens, both aggregations).
        chunk: tokens per minibatch chunk.
        pairs: all (every layer of A against every layer of B) or diagonal (layer i against layer i, equal depths:
            the arccos distance only, L times less work).
        dtype: load both models in this dtype (default as saved).
        device: cpu, cuda, ... (default: cuda when available); ignored with --device_map.
        device_map: spread each model over devices as it loads (auto, or a JSON object; see `layerwise coupling`).
        offload_folder: where weights offloaded to disk are kept (a sub-folder per model).
        out: output folder.
    """
    import torch
    from tqdm.auto import tqdm

    from layerwise.inference.compare import compare_models, write_comparison
    from layerwise.lightning_modules.checkpoint import load_model

    if block_size < 2 or batch_size < 1 or max_blocks < 1 or chunk < 4:
        raise ValueError("`--block_size` must be >= 2, `--batch_size` and `--max_blocks` >= 1, `--chunk` >= 4.")
    data = _text_data(
        text,
        dataset,
        dataset_config,
        tokenizer or model_tokenizer(model_a),
        tokenizer_dir,
        block_size,
        batch_size,
        None,
        max_blocks,
        "validate",
    )
    target = device or ("cuda" if torch.cuda.is_available() else "cpu")
    loaded = []
    for spec, name in ((model_a, "a"), (model_b, "b")):
        folder = None if offload_folder is None else Path(offload_folder) / name
        model_x = load_model(spec, f"--model_{name}", dtype=dtype, device_map=device_map, offload_folder=folder)
        loaded.append(model_x.eval() if device_map is not None else model_x.eval().to(target))
    first, second = loaded
    loader = data.val_dataloader()
    with tqdm(total=len(loader), desc="batches", unit="batch") as bar:
        results = compare_models(first, second, loader, include_embeddings, True, minibatch, chunk, bar.update, pairs)
    results = {"model_a": model_a, "model_b": model_b, **results}
    distance = results["arccos_distance"]
    print(
        f"{results['num_tokens']} tokens; mean diagonal CKA {float(results['cka'].diagonal().mean()):.4f}"
        + (f"; arccos distance {float(distance):.4f}" if distance is not None else "")
    )
    for path in write_comparison(results, out):
        print(path)


def stitch(
    model_a: str,
    model_b: str,
    task: Literal["causal_lm", "classification"] = "causal_lm",
    text: Optional[list[Path]] = None,
    dataset: Optional[str] = None,
    dataset_config: Optional[str] = None,
    glue_task: Optional[Literal["sst2", "mrpc", "qqp", "mnli", "qnli", "rte"]] = None,
    data_dir: Optional[Path] = None,
    hans: bool = False,
    hans_dir: Optional[Path] = None,
    hans_heuristic: Optional[Literal["lexical_overlap", "subsequence", "constituent"]] = "lexical_overlap",
    tokenizer: Optional[str] = None,
    tokenizer_dir: Optional[Path] = None,
    layers: Optional[list[int]] = None,
    pairs: Optional[list[str]] = None,
    phi: Literal["learned", "identity"] = "learned",
    phi_norm: Literal["none", "pre", "post"] = "none",
    phi_init: Literal["auto", "zero", "least_squares"] = "auto",
    steps: int = 2000,
    warmup_steps: int = 200,
    lr: float = 0.1,
    momentum: float = 0.9,
    weight_decay: float = 1e-3,
    gradient_clip: float = 1.0,
    precision: Optional[str] = None,
    block_size: int = 256,
    max_length: int = 128,
    batch_size: int = 8,
    max_train_blocks: Optional[int] = None,
    max_val_blocks: int = 64,
    accelerator: str = "auto",
    out: Path = Path("stitch"),
) -> None:
    """Stitching penalties of two causal LMs or two classifiers over a grid of layers (Brown et al., 2023).

    For each pair (l, m): B's blocks after m and head, fed A's residual stream after block l through phi, trained
    with only phi free (tuned-lens's recipe) and evaluated on held-out data. Causal LMs (``--task causal_lm``): trained
    on the first 90 % of --text (or a hub dataset's training split), penalty = L(stitched) - L(B) (and - L(A)) in nats
    per token on the rest. Classifiers (``--task classification``): a GLUE task's training and validation splits
    (--glue_task, --data_dir), the accuracy drops next to the loss penalties; ``--hans`` also evaluates every
    stitched model on HANS (an MNLI model's neutral and contradiction count as non-entailment). Writes stitch.json,
    stitch.md and stitch.png.

    Args:
        model_a: hub id, folder or layerwise checkpoint of A.
        model_b: the same for B (it must read the same token ids, and for classifiers predict the same classes).
        task: causal_lm or classification.
        text: local text files (the last 10 % is held out); causal_lm.
        dataset: a hub dataset id instead of --text; causal_lm.
        dataset_config: its configuration name.
        glue_task: the GLUE task of the classifiers (sst2, mnli, ...); classification.
        data_dir: a folder with the GLUE task's files (default: the hub's nyu-mll/glue).
        hans: also evaluate on HANS (MNLI classifiers).
        hans_dir: a folder with HANS's heuristics_evaluation_set.txt (default: the hub's jhu-cogsci/hans).
        hans_heuristic: the HANS subset (lexical_overlap is HANS-LO; null: all three).
        tokenizer: 'byte', 'bpe:N', 'wordpiece:N', a hub name or a folder (default: --model_a's; for a
            TransformerLens checkpoint, the one its config names).
        tokenizer_dir: folder holding trained tokenizers.
        layers: l = m pairs (default: 1 .. min(L_A, L_B) - 1).
        pairs: explicit pairs as l:m (overrides --layers).
        phi: learned, or identity (no training; equal widths).
        phi_norm: none, pre or post LayerNorm in phi.
        phi_init: auto (zero for equal widths, else least squares), zero or least_squares.
        steps: optimizer steps per pair.
        warmup_steps: linear warm-up steps, then linear decay to 0.
        lr: SGD learning rate (tuned-lens's 1.0 * (1 - momentum)).
        momentum: Nesterov momentum.
        weight_decay: SGD weight decay.
        gradient_clip: gradient-norm clip.
        precision: Lightning precision, e.g. bf16-mixed on a GPU (default: 32-true).
        block_size: tokens per packed block (causal_lm).
        max_length: tokens per example (classification).
        batch_size: blocks or examples per batch.
        max_train_blocks: at most this many training blocks (causal_lm) or examples (classification).
        max_val_blocks: at most this many held-out blocks or examples (HANS too).
        accelerator: Lightning accelerator (auto, cpu, gpu).
        out: output folder.
    """
    from layerwise.inference.stitch import parse_pairs, stitch_markdown, stitch_sweep, write_stitch
    from layerwise.lightning_modules.checkpoint import load_model

    if steps < 1 or warmup_steps < 0 or warmup_steps > steps:
        raise ValueError(f"`--steps={steps}` must be >= 1 and `--warmup_steps={warmup_steps}` in 0..steps.")
    if task == "causal_lm":
        _check_text_source(text, dataset)
        if glue_task is not None or hans:
            raise ValueError(
                "`--glue_task`/`--hans` are for `--task classification`; causal LMs read --text/--dataset."
            )
    elif glue_task is None or text or dataset:
        raise ValueError("`--task classification` reads a GLUE task: give --glue_task (and --data_dir), not --text.")
    if hans and glue_task != "mnli":
        raise ValueError(f"`--hans` evaluates MNLI classifiers; --glue_task is {glue_task!r}.")
    load_as = "causal_lm" if task == "causal_lm" else "classification"
    first, second = load_model(model_a, "--model_a", load_as), load_model(model_b, "--model_b", load_as)
    depth_a, depth_b = num_blocks(first, "--model_a"), num_blocks(second, "--model_b")
    chosen = parse_pairs(layers, pairs, depth_a, depth_b)
    stage = "validate" if phi == "identity" else "fit"
    extra: dict[str, Any] = {}
    if task == "causal_lm":
        data = _text_data(
            text,
            dataset,
            dataset_config,
            tokenizer or model_tokenizer(model_a),
            tokenizer_dir,
            block_size,
            batch_size,
            max_train_blocks,
            max_val_blocks,
            stage,
        )
    else:
        from layerwise.datamodules import GLUEDataModule, HANSDataModule

        data = GLUEDataModule(
            task=glue_task,
            data_dir=str(data_dir) if data_dir else None,
            tokenizer=tokenizer or model_tokenizer(model_a),
            tokenizer_dir=str(tokenizer_dir) if tokenizer_dir else None,
            max_length=max_length,
            batch_size=batch_size,
            max_train_samples=max_train_blocks,
            max_val_samples=max_val_blocks,
        )
        if hans:
            extra["hans"] = HANSDataModule(
                heuristic=hans_heuristic,
                data_dir=str(hans_dir) if hans_dir else None,
                tokenizer=tokenizer or model_tokenizer(model_a),
                max_length=max_length,
                batch_size=batch_size,
                max_val_samples=max_val_blocks,
            )
        for module in (data, *extra.values()):
            module.prepare_data()
            module.setup("validate" if module is not data else stage)
    module_options = dict(
        task=load_as,
        phi=phi,
        phi_norm=phi_norm,
        phi_init=phi_init,
        lr=lr,
        momentum=momentum,
        weight_decay=weight_decay,
        warmup_steps=warmup_steps,
        max_steps=steps,
    )
    trainer_options = dict(
        accelerator=accelerator,
        devices=1,
        max_steps=steps,
        gradient_clip_val=gradient_clip,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        precision=precision or "32-true",
        num_sanity_val_steps=0,
    )
    train_loader = data.train_dataloader() if stage == "fit" else None
    rows = stitch_sweep(
        first, second, chosen, train_loader, data.val_dataloader(), module_options, trainer_options, extra=extra
    )
    record = {
        "model_a": model_a,
        "model_b": model_b,
        ("held_out_blocks" if task == "causal_lm" else "held_out_examples"): len(data.val_dataloader().dataset),
        **({"block_size": block_size} if task == "causal_lm" else {"glue_task": glue_task, "max_length": max_length}),
        **(
            {"hans_examples": len(extra["hans"].val_dataloader().dataset), "hans_heuristic": hans_heuristic}
            if hans
            else {}
        ),  # fmt: skip
        **module_options,
        "steps": steps,
    }
    print(stitch_markdown(rows), end="")
    for path in write_stitch(rows, record, out):
        print(path)


def _load_for_coupling(
    checkpoint: Optional[Path],
    model: Optional[str],
    tokenizer: Optional[str],
    tokenizer_dir: Optional[Path],
    dtype: str,
    device: Optional[str],
    device_map: DeviceMap,
    offload_folder: Optional[Path],
) -> tuple[Any, Any, int]:
    """``_load_for_text``, then the model on ``device`` unless ``device_map`` placed it."""
    import torch

    lm, tokenizer_object, total = _load_for_text(
        checkpoint, model, tokenizer, tokenizer_dir, dtype, device_map, offload_folder
    )
    if device_map is None:
        lm = lm.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return lm, tokenizer_object, total


def _correlate(table: Path, score_column: Optional[str], k: Optional[int], out: Path) -> None:
    import matplotlib.pyplot as plt

    from layerwise.figures.coupling import correlation
    from layerwise.inference.coupling import correlate_scores

    fit = correlate_scores(table, score_column, k)
    out.mkdir(parents=True, exist_ok=True)
    print(
        f"{fit['score_column']} = {fit['intercept']:.4g} + {fit['slope']:.4g} * coupling  "
        f"(R² {fit['r2']:.3f}, p {fit['p_value']:.3g}, n {fit['n']})"
    )
    paths = [write_text_atomic(out / "correlation.json", json.dumps(fit, indent=1) + "\n")]
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


TRAINER_COMMANDS = {
    "fit": "train a model, analysing every validation (LightningCLI)",
    "validate": "analyse a model on the validation set (LightningCLI)",
    "test": "analyse a model on the test set (LightningCLI)",
    "predict": "predict, optionally with early exit (LightningCLI)",
}


def clip(
    data: Path,
    model: str = "openai/clip-vit-base-patch32",
    template: str = "This is a photo of a {label}.",
    batch_size: int = 64,
    max_pairs: int = 2000,
    center: bool = True,
    device: Optional[str] = None,
    out: Path = Path("clip"),
) -> None:
    """Layer-wise COS of a CLIP model within and across modalities (App. D of Jiang et al.).

    Every image of --data is paired with the caption --template naming its class. Vision features: the [CLS] token
    of every vision layer; text: the [EOS] token of every text layer; both also projected into the joint space by
    the model's own post-norm and projection. Writes clip.json (vision_cos, text_cos, their _projected forms,
    cross_cos: vision x text COS of the projected features of each pair) and clip_{vision,text,cross}.png to --out.

    Args:
        data: a CIFAR-10 python folder (cifar-10-batches-py: its test split) or an image folder with one
            sub-folder per class (torchvision ImageFolder).
        model: a CLIPModel hub id or folder (with its processor).
        template: the caption, with {label} for the class name.
        batch_size: pairs per batch.
        max_pairs: read at most this many pairs (the first ones, in order).
        center: centre the within-modality COS on the evaluated mean.
        device: cpu, cuda, ... (default: cuda when available).
        out: output folder.
    """
    import torch
    from torch.utils.data import DataLoader, Subset
    from transformers import AutoProcessor, CLIPModel

    from layerwise.inference.clip import CaptionedImages, CLIPAnalysis, pair_collate, write_clip

    if batch_size < 1 or max_pairs < 1:
        raise ValueError("`--batch_size` and `--max_pairs` must be >= 1.")
    images, classes = _image_dataset(data)
    pairs = CaptionedImages(images, classes, template)
    pairs = Subset(pairs, range(min(max_pairs, len(pairs))))
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    analysis = CLIPAnalysis(CLIPModel.from_pretrained(model).to(device), center=center)
    loader = DataLoader(pairs, batch_size=batch_size, collate_fn=pair_collate(AutoProcessor.from_pretrained(model)))
    for batch in loader:
        analysis.add({key: value.to(device) for key, value in batch.items()})
    results = {"model": model, "template": template, **analysis.results()}
    for path in write_clip(results, out):
        print(path)


def _image_dataset(data: Path) -> tuple[Any, list[str]]:
    """(PIL image, label) pairs and the class names of --data: CIFAR-10's test split or an ImageFolder tree."""
    from torchvision import datasets

    if not data.is_dir():
        raise ValueError(f"`--data={data}`: no such folder.")
    if (data / "test_batch").is_file() and (data / "batches.meta").is_file():
        from layerwise.datamodules.cifar import _LocalCIFAR10

        dataset = _LocalCIFAR10(data, train=False, download=False)
        return dataset, list(dataset.classes)
    try:
        dataset = datasets.ImageFolder(str(data))
    except (FileNotFoundError, RuntimeError) as error:
        raise ValueError(f"`--data={data}`: neither CIFAR-10's python folder nor an image folder ({error}).") from None
    return dataset, list(dataset.classes)


COMMANDS: dict[str, Callable[..., None]] = {
    "plot": plot,
    "export": export,
    "sweep": sweep,
    "generate": generate,
    "lens": lens,
    "coupling": coupling,
    "compare": compare,
    "stitch": stitch,
    "clip": clip,
    "report": report,
}
_POSITIONAL = {"path", "runs"}


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
    parser = ArgumentParser(
        prog=f"layerwise {name}",
        description=" ".join(filter(None, [docs.short_description, docs.long_description])),
    )
    parser.add_argument("--config", action=ActionConfigFile, help="a YAML file with any of the options below")
    hints = typing.get_type_hints(function)
    manual = {key for key in hints if key != "return" and (key in _POSITIONAL or _list_item(hints[key]) is not None)}
    parser.add_function_arguments(function, skip=manual, as_positional=False)
    for key, parameter in inspect.signature(function).parameters.items():
        if key not in manual:
            continue
        item = _list_item(hints[key])
        choices = list(typing.get_args(item)) if typing.get_origin(item) is Literal else None
        kind = str if choices else item
        flag = key if key in _POSITIONAL else f"--{key}"
        extra = {} if key in _POSITIONAL else {"default": parameter.default}
        if choices:
            extra["choices"] = choices
        parser.add_argument(flag, nargs="+" if item else None, type=kind or hints[key], help=help_of.get(key), **extra)
    return parser


def build_parser() -> ArgumentParser:
    """The top-level parser: every subcommand with its one-line help (``layerwise --help``)."""
    parser = ArgumentParser(
        prog="layerwise",
        description="Trace how representations progress through the layers of a transformer. `layerwise COMMAND "
        "--help` shows the options of a command.",
    )
    subcommands = parser.add_subcommands(dest="command", required=True)
    for name, help_text in TRAINER_COMMANDS.items():
        subcommands.add_subcommand(name, ArgumentParser(prog=f"layerwise {name}"), help=help_text)
    for name, function in COMMANDS.items():
        summary = (function.__doc__ or "").strip().splitlines()[0]
        subcommands.add_subcommand(name, command_parser(name, function), help=summary)
    return parser


def run_command(name: str, argv: list[str]) -> None:
    """Parse ``argv`` for command ``name`` and run it; a bad value ends in one ``error:`` line naming the flag."""
    parser = command_parser(name, COMMANDS[name])
    config = parser.parse_args(argv)
    arguments = {key: value for key, value in vars(config).items() if key != "config"}
    try:
        COMMANDS[name](**arguments)
    except (ValueError, TypeError, FileNotFoundError, RuntimeError) as error:
        if os.environ.get(DEBUG_VARIABLE):
            raise
        exit_concisely(f"layerwise {name}", str(error), parsed=False)


class _UpstreamNoise(logging.Filter):
    """Drops Lightning's lines a layerwise user must otherwise learn to ignore (the commands only, not the library)."""

    NOISE = ("💡 Tip:", "GPU available:", "TPU available:", "HPU available:")

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(self.NOISE)


def quiet_upstream() -> None:
    """Silence upstream noise that says nothing about the run, each case named here.

    - Lightning's advertisement for its cloud logger and its accelerator inventory (logging, INFO).
    - ``isinstance(treespec, LeafSpec)`` is deprecated: Lightning 2.6's own use of torch's pytree, harmless, fixed
      upstream in later releases.
    """
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).addFilter(_UpstreamNoise())
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated")


def main(args: Optional[list[str]] = None) -> None:
    """Entry point of ``layerwise`` and ``python -m layerwise``."""
    quiet_upstream()
    argv = sys.argv[1:] if args is None else list(args)
    if argv and argv[0] in COMMANDS:
        run_command(argv[0], argv[1:])
    elif argv and argv[0] in TRAINER_COMMANDS or argv[:1] and argv[0].startswith("--config"):
        LayerwiseCLI(args=args)  # None: LightningCLI reads sys.argv itself
    else:
        build_parser().parse_args(argv)  # --help lists every command; anything else is an error naming the choices
