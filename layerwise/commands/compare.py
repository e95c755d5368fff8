"""Compare two models over a stream of batches: CKA across models and the arccos distance (``layerwise compare``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal, Optional

from layerwise.commands._options import (
    DeviceMap,
    TextSource,
    at_least,
    check_block_size,
    check_same_vocab,
    load_model_as,
    model_tokenizer,
)
from layerwise.engines.compare import compare_models
from layerwise.errors import UsageError

COMPARE_FILES = ("compare.json", "compare_cka.png")  # what `compare` writes into --out (and compare_<measure>.png)


def write_comparison(results: dict[str, Any], out: Path) -> list[Path]:
    """``compare.json``, ``compare_cka.png`` and, with ``--measure``, ``compare_<measure>.png`` in ``out``."""
    import matplotlib.pyplot as plt

    from layerwise.figures.summary import compare_figures
    from layerwise.results import save_figure_atomic, to_json, write_text_atomic

    json_name = COMPARE_FILES[0]
    out.mkdir(parents=True, exist_ok=True)
    record = to_json(results)
    paths = [write_text_atomic(out / json_name, json.dumps(record, indent=1) + "\n")]
    for name, figure in compare_figures(record).items():  # the callback's figures, drawn from the same record
        try:
            paths.append(save_figure_atomic(out / f"{name}.png", figure))
        finally:
            plt.close(figure)
    return paths


def _base_model_prefix(spec: str) -> Optional[str]:
    """The attribute under which ``spec``'s causal LM holds the base model (``model``, ``transformer``), or None."""
    if str(spec).endswith(".ckpt"):
        return None  # a checkpoint is loaded whole: no device_map to translate
    from transformers import MODEL_MAPPING, AutoConfig

    try:
        config = AutoConfig.from_pretrained(spec)
        return getattr(MODEL_MAPPING[type(config)], "base_model_prefix", None) or None
    except (OSError, ValueError, KeyError):  # not a Hugging Face model: loading it reports why, in its own words
        return None


def base_device_map(device_map: DeviceMap, spec: str) -> DeviceMap:
    """``--device_map`` for the base model ``compare`` loads, given in its own module names or in the causal LM's.

    ``lens`` and ``coupling`` load the causal LM (``model.layers.0``, ``lm_head``); ``compare`` its base model
    (``layers.0``). A map that names modules under the causal LM's prefix is translated: the prefix dropped, the
    modules outside it (the LM head, which the base model lacks) left out.
    """
    if not isinstance(device_map, dict):
        return device_map
    prefix = _base_model_prefix(spec)
    if prefix is None or not any(name == prefix or name.startswith(prefix + ".") for name in device_map):
        return device_map
    translated = {}
    for name, device in device_map.items():
        if name == prefix:
            translated[""] = device
        elif name.startswith(prefix + "."):
            translated[name.removeprefix(prefix + ".")] = device
    return translated


def _load_for_comparison(spec: str, flag: str, dtype: Optional[str], device_map: DeviceMap, folder: Optional[Path]):
    """``spec``'s base model, placed by ``device_map`` (either naming); an incomplete map is a one-line error."""
    try:
        return load_model_as(
            spec, flag, dtype=dtype, device_map=base_device_map(device_map, spec), offload_folder=folder
        )
    except ValueError as error:
        if "device_map provided does not give any device" not in str(error):
            raise
        prefix = _base_model_prefix(spec)
        example = f" (e.g. 'layers.0', or '{prefix}.layers.0' as for lens and coupling)" if prefix else ""
        missing = str(error).split("parameters:", 1)[-1].strip().split(", ")
        raise UsageError(
            f"`--device_map` places none of {flag}'s {', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''}: "
            f"compare loads the base model, so name its modules or the causal LM's{example}, every one of them."
        ) from None


def _check_sizes(block_size: int, batch_size: int, max_blocks: int, chunk: int) -> None:
    """A one-line error naming the flag of a size below its least value."""
    at_least("block_size", block_size, 2)
    at_least("batch_size", batch_size, 1)
    at_least("max_blocks", max_blocks, 1)
    at_least("chunk", chunk, 4, "the unbiased HSIC needs 4 tokens per chunk")


# ------------------------------------------------------------------------------- the `layerwise compare` command
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
    precision: Literal["exact", "fast"] = "exact",
    measure: Optional[list[Literal["cca", "svcca", "pwcca", "procrustes", "shape", "effective_rank"]]] = None,
    svcca_variance: float = 0.99,
    shape_alpha: float = 0.5,
    dtype: Optional[Literal["float32", "bfloat16", "float16", "float64"]] = None,
    device: Optional[str] = None,
    device_map: DeviceMap = None,
    offload_folder: Optional[Path] = None,
    out: Path = Path("compare"),
    overwrite: bool = False,
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
        tokenizer: 'byte' (257 ids), 'bpe:N', 'wordpiece:N', a hub name or a folder (default: --model_a's; for a
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
        precision: exact (every product in float64) or fast (each batch's products in float32, summed in float64
            across batches: the products at float32's rate; CKA within 1e-4 of exact, 1.5e-9 measured at
            GPT-2-small's shape by benchmarks/compare_precision.py).
        measure: further measures from the same exact sums, on every token (see docs/similarity-measures.md):
            cca, svcca, pwcca, procrustes, shape, effective_rank; written under "measures" in compare.json.
        svcca_variance: the share of each layer's variance SVCCA keeps.
        shape_alpha: the shape metric's alpha (0: CCA, 1: Procrustes; netrep's angular shape distance).
        dtype: load both models in this dtype (default as saved).
        device: cpu, cuda, ... (default: cuda when available); ignored with --device_map.
        device_map: spread each model over devices as it loads (auto, or a JSON object; see `layerwise coupling`),
            naming the base model's modules ('layers.0') or the causal LM's ('model.layers.0', as lens and coupling).
        offload_folder: where weights offloaded to disk are kept (a sub-folder per model).
        out: output folder.
        overwrite: replace the results of an earlier run in --out (without it, the command stops at them).
    """
    import torch
    from tqdm.auto import tqdm

    from layerwise.figures.compare import CROSS_MEASURE_TITLES
    from layerwise.results import check_outputs_free

    _check_sizes(block_size, batch_size, max_blocks, chunk)
    TextSource(text, dataset, dataset_config).check()
    drawn = tuple(f"compare_{name}.png" for name in CROSS_MEASURE_TITLES if name in (measure or ()))
    check_outputs_free(out, COMPARE_FILES + drawn, overwrite)
    target = device or ("cuda" if torch.cuda.is_available() else "cpu")
    loaded = []
    for spec, name in ((model_a, "a"), (model_b, "b")):
        folder = None if offload_folder is None else Path(offload_folder) / name
        model_x = _load_for_comparison(spec, f"--model_{name}", dtype, device_map, folder)
        loaded.append(model_x.eval() if device_map is not None else model_x.eval().to(target))
    check_same_vocab(*loaded)
    check_block_size(block_size, {"--model_a": loaded[0], "--model_b": loaded[1]})
    data = TextSource(text, dataset, dataset_config).datamodule(
        tokenizer or model_tokenizer(model_a),
        tokenizer_dir,
        block_size,
        batch_size,
        None,
        max_blocks,
        "validate",
        models={"--model_a": loaded[0], "--model_b": loaded[1]},
    )
    first, second = loaded
    loader = data.val_dataloader()
    with tqdm(total=len(loader), desc="batches", unit="batch") as bar:
        results = compare_models(
            first,
            second,
            loader,
            include_embeddings,
            True,
            minibatch,
            chunk,
            bar.update,
            pairs,
            precision,
            measure or (),
            svcca_variance,
            shape_alpha,
        )
    results = {"model_a": model_a, "model_b": model_b, **results}
    distance = results["arccos_distance"]
    print(
        f"{results['num_tokens']} tokens; mean diagonal CKA {float(results['cka'].diagonal().mean()):.4f}"
        + (f"; arccos distance {float(distance):.4f}" if distance is not None else "")
    )
    for path in write_comparison(results, out):
        print(path)
