"""Lens view of a generation: which token the shared head predicts from every layer at every generated position.

The full model generates greedily from a prompt; then, for each generated position ``p`` and each layer ``l``, the
model's own final norm + LM head is applied to ``h_l`` (the residual stream after block ``l``) at the position that
predicts ``p``, giving a token and its probability. The last layer's row is the generation itself. Rendered as a
markdown table and as a heatmap of probabilities with the token text in each cell, like the paper's illustration of
saturation events in LLaMA-3.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional, Union

from layerwise.commands._lazy import ANNOTATIONS_ONLY, no_grad
from layerwise.commands._options import DeviceMap, DType, ModelSource, check_layer_numbers

if ANNOTATIONS_ONLY:
    from torch import Tensor, nn


@dataclass
class LensTable:
    """Per-layer predictions of the shared head at every generated position.

    Attributes:
        prompt: the prompt text.
        layers: 1-based layer numbers of the rows (``R`` of them, shallow to deep).
        generated_ids: the ``P`` token ids the full model generated greedily.
        generated_tokens: their decoded text, one string per token.
        token_ids: ``(R, P)`` the argmax token of ``softmax(head(h_l))`` at each generated position.
        probs: ``(R, P)`` its probability.
        tokens: ``R`` lists of ``P`` decoded tokens, the text of ``token_ids``.
    """

    prompt: str
    layers: list[int]
    generated_ids: list[int]
    generated_tokens: list[str]
    token_ids: Tensor
    probs: Tensor
    tokens: list[list[str]]


@no_grad
def lens_table(
    model: nn.Module,
    tokenizer: Any,
    prompt: str,
    max_new_tokens: int,
    layers: Union[int, Sequence[int], None] = None,
    translators: Optional[Any] = None,
) -> LensTable:
    """Generate greedily with the full model and read every layer through the shared head at each new position.

    The generated token ``p`` is predicted from the hidden state one position earlier, so row ``l`` column ``p`` is
    ``argmax softmax(head(h_l))`` there. One forward over the prompt and the generation (its last token excluded)
    captures the chosen layers at the generated positions only (``R x P x d``); the logits are then computed one
    layer at a time, ``(P, V)`` each, never ``R x P x V`` at once.

    Args:
        model: a Hugging Face causal LM of a family in :data:`~layerwise.features.paths.FAMILIES`.
        tokenizer: its tokenizer (a ``PreTrainedTokenizerFast``); generation stops at ``tokenizer.eos_token_id``.
        prompt: the prompt text.
        max_new_tokens: the number of generated positions ``P`` (fewer if the model produces the EOS token).
        layers: rows, as in :func:`~layerwise.features.select_layers`: None for every layer, an int ``n`` for the last
            ``n``, or 0-based block indices (negatives from the end).
        translators: a tuned lens (:class:`~layerwise.engines.lens.Translators`): every layer read through its
            translator and the head; None: the head alone (the logit lens).

    Returns:
        A :class:`LensTable`.
    """
    import torch

    from layerwise.commands.decoding import generate_from_layer
    from layerwise.engines.readout import chunked_readout
    from layerwise.features.hf import input_device
    from layerwise.features.hooks import hooked_blocks
    from layerwise.features.layers import select_layers
    from layerwise.features.modes import eval_mode
    from layerwise.features.paths import HeadSteps, get_blocks, layer_paths

    paths = layer_paths(model, "--model")
    blocks = get_blocks(model, paths, "--model")
    head = HeadSteps(model, paths.shared_head, "--model")
    rows = select_layers(layers, len(blocks))
    heads = [head] * len(blocks) if translators is None else translators.heads(head)
    device = input_device(model)
    prompt_ids = tokenizer(prompt, return_tensors="pt")["input_ids"].to(device)
    if prompt_ids.size(1) == 0:
        raise ValueError(f"`--prompt={prompt!r}` gives no tokens; give a non-empty prompt.")
    generated = generate_from_layer(
        model, prompt_ids, len(blocks), max_new_tokens, eos_token_id=tokenizer.eos_token_id
    )[0]
    sequence = torch.cat([prompt_ids[0], generated[:-1]])[None]
    start = prompt_ids.size(1) - 1
    captured: dict[int, Tensor] = {}

    def capture(index: int, hidden: Tensor) -> None:
        captured[index] = hidden[0, start:]

    with eval_mode(model), hooked_blocks(blocks, on_output=capture, indices=rows):
        model(input_ids=sequence, use_cache=False, logits_to_keep=1)
    token_ids, probs = [], []
    for index in rows:  # a layer at a time: on a device-mapped model the layers' states live on different devices
        hidden = captured.pop(index)
        if translators is not None:
            translators.to(hidden.device)
        readout = chunked_readout(heads[index], hidden[None])  # the one readout of the (tuned) lens at layer l
        token_ids.append(readout.predictions[0].cpu())
        probs.append(readout.max_prob[0].float().cpu())
    token_ids_tensor = torch.stack(token_ids)
    return LensTable(
        prompt=prompt,
        layers=[index + 1 for index in rows],
        generated_ids=generated.tolist(),
        generated_tokens=[tokenizer.decode([token]) for token in generated.tolist()],
        token_ids=token_ids_tensor,
        probs=torch.stack(probs),
        tokens=[[tokenizer.decode([token]) for token in row] for row in token_ids_tensor.tolist()],
    )


def _panel(name: str, readout: Any, rows: Sequence[int], text: Any) -> dict[str, Any]:
    """One lens's panel of a trajectory: the selected rows of a referenced readout as lists; ``text(id)`` names ids."""
    assert readout.entropy is not None and readout.kl_to_final is not None, "chunked_readout(..., reference=True)"
    top = readout.predictions[list(rows)].cpu().tolist()
    return {
        "name": name,
        "top_ids": top,
        "tokens": [[text(index) for index in row] for row in top],
        "probability": readout.max_prob[list(rows)].cpu().tolist(),
        "entropy": readout.entropy[list(rows)].cpu().tolist(),
        "kl_to_final": readout.kl_to_final[list(rows)].clamp_min(0.0).cpu().tolist(),  # >= 0, rounding aside
    }


TRAJECTORY_FORMAT = "layerwise.lens_trajectory"
STATISTICS = {"probability": "probability", "entropy": "entropy", "kl": "kl_to_final"}  # --statistic -> JSON key


@no_grad
def lens_trajectory(
    model: nn.Module,
    tokenizer: Any,
    prompt: str,
    lenses: dict[str, Optional[Any]],
    layers: Union[int, Sequence[int], None] = None,
) -> dict[str, Any]:
    """The prediction trajectory of a prompt: every layer's top next-token prediction at every prompt position.

    As tuned-lens's ``PredictionTrajectory``: one forward over the prompt captures ``h_l`` (the residual stream
    after block ``l``) at every position ``p``; each lens reads it, ``softmax(head(T_l(h_l)))`` (``T_l`` the tuned
    lens's translator, the identity for the logit lens), the distribution over the token after ``p``. Per layer and
    position: the top token, its probability, the distribution's entropy and ``KL(p_L || p_l)`` from the last layer's
    distribution (nats), computed over every layer, so the KL's reference is the model's final layer whichever rows
    are kept.

    Args:
        model: a Hugging Face causal LM of a family in :data:`~layerwise.features.paths.FAMILIES`.
        tokenizer: its tokenizer.
        prompt: the input text (its tokens are the positions).
        lenses: name -> translators (:class:`~layerwise.engines.lens.Translators`) or None for the logit lens;
            the panels, in order.
        layers: rows, as in :func:`~layerwise.features.select_layers` (0-based block indices; None: every layer).

    Returns:
        The trajectory as JSON-ready data (``format`` :data:`TRAJECTORY_FORMAT`): ``prompt``, ``input_ids``,
        ``input_tokens`` (P), ``positions`` (0-based), ``layers`` (R, 1-based), ``num_layers``, ``vocab_size`` and
        ``lenses``: per lens its ``name`` and ``(R, P)`` lists ``top_ids``, ``tokens``, ``probability``,
        ``entropy``, ``kl_to_final``.
    """
    import torch

    from layerwise.engines.readout import chunked_readout
    from layerwise.features.hf import input_device
    from layerwise.features.hooks import hooked_blocks
    from layerwise.features.layers import select_layers
    from layerwise.features.modes import eval_mode
    from layerwise.features.paths import HeadSteps, get_blocks, layer_paths

    paths = layer_paths(model, "--model")
    blocks = get_blocks(model, paths, "--model")
    head = HeadSteps(model, paths.shared_head, "--model")
    rows = select_layers(layers, len(blocks))
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"].to(input_device(model))
    if ids.size(1) == 0:
        raise ValueError(f"`--prompt={prompt!r}` gives no tokens; give a non-empty prompt.")
    captured: dict[int, Tensor] = {}
    with eval_mode(model), hooked_blocks(blocks, on_output=lambda i, hidden: captured.__setitem__(i, hidden[0])):
        model(input_ids=ids, use_cache=False, logits_to_keep=1)
    device = captured[len(blocks) - 1].device  # beside the head: a device-mapped model's layers may lie elsewhere
    features = torch.stack([captured[index].to(device) for index in range(len(blocks))])  # (L, P, d)
    panels = []
    for name, translators in lenses.items():
        if translators is not None:
            translators.to(device)
        heads = head if translators is None else translators.heads(head)
        readout = chunked_readout(heads, features, reference=True)  # KL and entropy against the last layer's
        panels.append(_panel(name, readout, rows, lambda token: tokenizer.decode([token])))
    input_ids = ids[0].tolist()
    return {
        "format": TRAJECTORY_FORMAT,
        "prompt": prompt,
        "input_ids": input_ids,
        "input_tokens": [tokenizer.decode([token]) for token in input_ids],
        "positions": list(range(len(input_ids))),
        "layers": [index + 1 for index in rows],
        "num_layers": len(blocks),
        "vocab_size": int(getattr(getattr(model, "config", None), "vocab_size", 0) or 0),
        "lenses": panels,
    }


def _evaluation_sample(checkpoint: Path, sample: int) -> tuple[Any, list[str]]:
    """The batch of one sample (``--sample``) of a run's evaluation set, its label, and the data's class names.

    The data is the run's own: the ``data`` of ``config.yaml`` in the run folder above ``checkpoints/``, a class of
    layerwise's (as :func:`~layerwise.engines.checkpoint.load_module` trusts only layerwise's classes), built with its
    ``init_args``; the evaluation set is its first validation dataloader's.
    """
    import yaml

    run = Path(checkpoint).resolve().parent.parent
    config = run / "config.yaml"
    if not config.is_file():
        raise ValueError(f"`--sample`: no config.yaml in {run} (the run of --checkpoint) to find its evaluation set.")
    data = (yaml.safe_load(config.read_text(encoding="utf-8")) or {}).get("data") or {}
    class_path = str(data.get("class_path", "")) if isinstance(data, dict) else ""
    import layerwise.datamodules as datamodules

    name = class_path.rpartition(".")[2]  # one of the package's datamodules, from its static table: no other import
    if not class_path.startswith("layerwise.datamodules.") or name not in datamodules.__all__:
        raise ValueError(f"`--sample`: {config} names no layerwise datamodule under `data.class_path`.")
    datamodule = getattr(datamodules, name)(**(data.get("init_args") or {}))
    datamodule.setup("validate")
    loaders = datamodule.val_dataloader()
    loader = next(iter(loaders.values())) if isinstance(loaders, dict) else loaders
    loader = loader[0] if isinstance(loader, (list, tuple)) else loader
    if not 0 <= sample < len(loader.dataset):
        raise ValueError(
            f"`--sample={sample}`: the evaluation set has {len(loader.dataset)} samples, 0..{len(loader.dataset) - 1}."
        )
    batch = loader.collate_fn([loader.dataset[sample]])
    names = getattr(datamodule, "class_names", None)
    return batch, list(names) if names else []


@no_grad
def classifier_trajectory(
    module: Any,
    batch: Any,
    lenses: dict[str, Optional[Any]],
    layers: Union[int, Sequence[int], None] = None,
    class_names: Sequence[str] = (),
    title: str = "",
) -> dict[str, Any]:
    """The prediction trajectory of one sample of a classifier: every layer's top class through each lens.

    One column (the pooled feature the model's head reads); per layer the top class, its probability, the entropy
    and ``KL(p_L || p_l)`` from the last layer's distribution, as :func:`lens_trajectory` for a prompt.

    Args:
        module: a layerwise module of a classifier (its ``backbone`` reads the batch).
        batch: one sample as its dataloader collates it.
        lenses: name -> translators or None (the logit lens: the head itself), the panels in order.
        layers: rows (0-based block indices; None: every layer).
        class_names: the classes' names (default their indices).
        title: what the figure names the sample by.
    """
    from layerwise.engines.readout import chunked_readout
    from layerwise.features import FEATURES, TARGETS
    from layerwise.features.layers import select_layers
    from layerwise.features.modes import eval_mode

    with eval_mode(module):
        outputs = module.samples(batch)
    features, head = outputs[FEATURES][:, :1], module.backbone.head  # (L, 1, d)
    rows = select_layers(layers, features.size(0))
    label = int(outputs[TARGETS][0]) if outputs.get(TARGETS) is not None else None
    names = list(class_names)

    def name(index: int) -> str:
        return names[index] if index < len(names) else str(index)

    panels = []
    for lens_name, translators in lenses.items():
        if translators is not None:
            translators.to(features.device)
        readout = chunked_readout(head if translators is None else translators.heads(head), features, reference=True)
        panels.append(_panel(lens_name, readout, rows, name))
    return {
        "format": TRAJECTORY_FORMAT,
        "kind": "classifier",
        "prompt": title,
        "label": label,
        "input_ids": [],
        "input_tokens": [f"label {name(label)}" if label is not None else "sample"],
        "positions": [0],
        "layers": [index + 1 for index in rows],
        "num_layers": int(features.size(0)),
        "vocab_size": int(getattr(module.backbone, "num_classes", 0) or 0),
        "lenses": panels,
    }


TRAJECTORY_FILES = ("lens_trajectory.json", "lens_trajectory.pdf", "lens_trajectory.png")  # --trajectory's files


def write_trajectory(
    trajectory: dict[str, Any], statistic: str, out_dir: Path, titles: bool = True, dpi: int = 300
) -> list[Path]:
    """Write the trajectory's numbers (``lens_trajectory.json``) and its figure (PDF and PNG) to ``out_dir``."""
    import json

    from layerwise.figures.lens import trajectory_figure
    from layerwise.figures.style import plt, provenance_metadata
    from layerwise.results import save_figure_atomic, write_text_atomic

    target = Path(out_dir)
    target.mkdir(parents=True, exist_ok=True)
    data_path, *figure_paths = (target / name for name in TRAJECTORY_FILES)
    record = {**trajectory, "statistic": STATISTICS[statistic]}
    write_text_atomic(data_path, json.dumps(record, indent=1, allow_nan=False) + "\n")
    figure = trajectory_figure(record, titled=titles)
    try:
        for path in figure_paths:
            fmt = path.suffix[1:]
            save_figure_atomic(path, figure, dpi=dpi, metadata=provenance_metadata(figure, fmt))
    finally:
        plt.close(figure)
    return [data_path, *figure_paths]


def _visible(token: str) -> str:
    r"""A token as one printable line: control characters (newline, tab, ...) escaped as ``\n``, ``\x1d``."""
    return "".join(char if char.isprintable() else char.encode("unicode_escape").decode() for char in token)


def _markdown_cell(token: str) -> str:
    """A token as a markdown code span (``|`` escaped for the table); an empty token as ``(empty)``."""
    if not token:
        return "(empty)"
    return "`" + _visible(token).replace("|", "\\|").replace("`", "'") + "`"


def lens_markdown(table: LensTable) -> str:
    """The table as markdown: one row per layer, one column per generated position, cells ``token (p)``."""
    header = ["layer"] + [f"{p + 1}: {_markdown_cell(token)}" for p, token in enumerate(table.generated_tokens)]
    lines = [
        f"Prompt: {_markdown_cell(table.prompt)}",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    for layer, tokens, probs in zip(table.layers, table.tokens, table.probs.tolist()):
        cells = [f"{_markdown_cell(token)} ({prob:.2f})" for token, prob in zip(tokens, probs)]
        lines.append("| " + " | ".join([str(layer), *cells]) + " |")
    return "\n".join(lines) + "\n"


LENS_FILES = ("lens.md", "lens.png")  # what `lens` writes into --out


def write_lens(table: LensTable, out_dir: Optional[Path] = None) -> list[Path]:
    """Write ``lens.md`` and ``lens.png`` to ``out_dir`` (default the current folder); returns their paths."""
    from layerwise.figures.lens import lens_figure
    from layerwise.figures.style import plt
    from layerwise.results import save_figure_atomic, write_text_atomic

    target = Path(out_dir or ".")
    target.mkdir(parents=True, exist_ok=True)
    markdown_path, figure_path = (target / name for name in LENS_FILES)
    write_text_atomic(markdown_path, lens_markdown(table))
    figure = lens_figure(table.probs.numpy(), table.tokens, table.generated_tokens, table.layers, table.prompt)
    try:
        save_figure_atomic(figure_path, figure)
    finally:
        plt.close(figure)
    return [markdown_path, figure_path]


def _tuned_lens(lens: str) -> Any:
    """The translators of ``--lens`` (None for ``logit``), read before the model is loaded."""
    if lens == "logit":
        return None
    from layerwise.engines.lens import load_translators

    return load_translators(lens, "--lens")


def _check_trajectory_options(trajectory: bool, statistic: str, no_title: bool) -> None:
    """One line naming the option when ``--statistic`` or ``--no_title`` is given without ``--trajectory``."""
    if statistic not in STATISTICS:
        raise ValueError(f"`--statistic={statistic}`: choose one of {', '.join(STATISTICS)}.")
    if not trajectory and (statistic != "probability" or no_title):
        given = f"--statistic={statistic}" if statistic != "probability" else "--no_title=true"
        raise ValueError(f"`{given}` belongs to the prediction trajectory: add --trajectory true.")


def _check_prompt_fits(model: Any, tokenizer: Any, prompt: str) -> None:
    """One line naming ``--prompt`` when it has more tokens than the model reads."""
    from layerwise.commands._options import model_positions

    positions, count = model_positions(model), len(tokenizer(prompt)["input_ids"])
    if positions is not None and count > positions:
        raise ValueError(f"`--prompt` has {count} tokens; the model reads at most {positions}: give a shorter prompt.")


def _check_sample_options(
    sample: int, trajectory: bool, prompt: Optional[str], checkpoint: Optional[Path], model: Optional[str]
) -> None:
    """One line naming the option when ``--sample`` comes without what it needs, or with what it replaces."""
    if not trajectory:
        raise ValueError(f"`--sample={sample}` belongs to the prediction trajectory: add --trajectory true.")
    if sample < 0:
        raise ValueError(f"`--sample={sample}`: give the index of a sample of the evaluation set, from 0.")
    if prompt is not None:
        raise ValueError("`--sample` reads a classifier's sample, `--prompt` a language model's text: give one.")
    if checkpoint is None or model is not None:
        raise ValueError("`--sample` reads a classifier's layerwise checkpoint: give --checkpoint (not --model).")


def _sample_trajectory(checkpoint: Path, sample: int, translators: Any, layers: Optional[list[int]]) -> dict:
    """The trajectory of ``--sample`` of a classifier's ``--checkpoint``; every option checked before the forward."""
    from layerwise.engines.checkpoint import load_module
    from layerwise.engines.lens import check_lens_fits

    module = load_module(checkpoint, "--checkpoint")
    backbone: Any = module.backbone
    if backbone.token_level:
        raise ValueError(f"`--sample`: `--checkpoint={checkpoint}` is a language model; give --prompt instead.")
    check_layer_numbers("--layers", layers or [], backbone.num_layers)
    if translators is not None:
        check_lens_fits(translators, backbone.num_layers, backbone.embed_dim, "--lens")
    batch, names = _evaluation_sample(checkpoint, sample)
    lenses = {"logit lens": None} if translators is None else {"logit lens": None, "tuned lens": translators}
    rows = None if layers is None else [number - 1 for number in layers]
    title = f"sample {sample} of the evaluation set"
    return classifier_trajectory(module, batch, lenses, rows, names, title)


# ------------------------------------------------------------------------------- the `layerwise lens` command
def lens(
    prompt: Optional[str] = None,
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
    overwrite: bool = False,
    lens: str = "logit",
    trajectory: bool = False,
    statistic: Literal["probability", "entropy", "kl"] = "probability",
    no_title: bool = False,
    sample: Optional[int] = None,
) -> None:
    """What the shared head predicts from every layer at every position the full model generates greedily.

    Writes lens.md and lens.png with the token and probability of every layer at every generated position; with
    --trajectory, the prediction trajectory of the prompt itself instead (lens_trajectory.json, .pdf and .png).

    Args:
        prompt: the text to continue (with --trajectory: the input whose positions are read).
        checkpoint: a layerwise Lightning checkpoint (.ckpt) of a causal LM.
        model: a Hugging Face causal LM: hub name or local folder.
        tokenizer: as for generate; default: --model (required with --checkpoint).
        tokenizer_dir: folder holding trained tokenizers (the data cache_dir).
        layers: rows to show, layer numbers 1..L (default: all).
        max_new_tokens: tokens to generate (not with --trajectory, which generates none).
        dtype: load --model in this dtype (default as saved).
        device_map: spread --model over devices as it loads: auto (every GPU, then the CPU, then the disk) or a
            JSON object from module name to cpu, a GPU index or disk (accelerate).
        offload_folder: where weights offloaded to disk are kept.
        out: folder for the files (a run folder: `layerwise report` shows the trajectory found there).
        overwrite: replace the results of an earlier run in --out (without it, the command stops at them).
        lens: logit (the model's own head at every layer) or a tuned lens file (tuned_lens.safetensors of a
            `fit --config tuned_lens/...` run): every layer read through its translator and the head; with
            --trajectory, the logit and the tuned lens side by side.
        trajectory: the prediction trajectory of the prompt (as tuned-lens's PredictionTrajectory): a heatmap of
            layer x prompt position, each cell the top next-token prediction, coloured by --statistic, and its
            numbers (top ids, tokens, probability, entropy, KL to the last layer) in lens_trajectory.json.
        statistic: the trajectory's colour: probability (of the top token), entropy (nats) or kl (KL from the last
            layer's distribution, nats).
        no_title: leave the trajectory figure's title off (it goes into the files' metadata).
        sample: with --trajectory and a classifier's --checkpoint (instead of --prompt): the index of the sample in
            the run's evaluation set (the first validation set of the data in the run's config.yaml), read as one
            column, the pooled feature the head reads.
    """
    from layerwise.commands.decoding import check_generation_options
    from layerwise.results import check_outputs_free

    check_layer_numbers("--layers", layers or [])
    _check_trajectory_options(trajectory, statistic, no_title)
    if sample is not None:
        _check_sample_options(sample, trajectory, prompt, checkpoint, model)
        check_outputs_free(out, TRAJECTORY_FILES, overwrite)
        record = _sample_trajectory(Path(str(checkpoint)), sample, _tuned_lens(lens), layers)
        for path in write_trajectory(record, statistic, out, titles=not no_title):
            print(path)
        return
    if not prompt:
        raise ValueError("`--prompt` is empty; give the text to continue (or a classifier's --sample N).")
    check_generation_options(max_new_tokens, "greedy", 1, 1.0, 1.0)
    check_outputs_free(out, TRAJECTORY_FILES if trajectory else LENS_FILES, overwrite)
    translators = _tuned_lens(lens)
    lm, tokenizer_object, total = ModelSource(
        checkpoint, model, tokenizer, tokenizer_dir, dtype, device_map, offload_folder
    ).load()
    check_layer_numbers("--layers", layers or [], total)
    if translators is not None:
        from layerwise.engines.lens import check_lens_fits

        check_lens_fits(translators, total, int(lm.config.hidden_size), "--lens")
    rows = None if layers is None else [number - 1 for number in layers]
    if trajectory:
        _check_prompt_fits(lm, tokenizer_object, prompt)
        lenses = {"logit lens": None} if translators is None else {"logit lens": None, "tuned lens": translators}
        for written in write_trajectory(
            lens_trajectory(lm, tokenizer_object, prompt, lenses, rows), statistic, out, titles=not no_title
        ):
            print(written)
        return
    table = lens_table(lm, tokenizer_object, prompt, max_new_tokens, rows, translators)
    print(lens_markdown(table))
    for written in write_lens(table, out):
        print(written)
