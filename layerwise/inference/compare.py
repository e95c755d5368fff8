"""Compare two models over a stream of batches: CKA across models and the arccos distance (``layerwise compare``)."""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, Optional

from layerwise.errors import UsageError
from layerwise.inference._lazy import ANNOTATIONS_ONLY
from layerwise.inference._options import (
    DeviceMap,
    TextSource,
    check_block_size,
    check_same_vocab,
    load_model_as,
    model_tokenizer,
)

if ANNOTATIONS_ONLY:
    import torch
    from torch import Tensor, nn

    from layerwise.metrics.compare import CrossModelCKA


def model_inputs(batch: Any) -> tuple[tuple[Tensor, ...], dict[str, Tensor], Optional[Tensor]]:
    """Positional and keyword inputs of a batch for a table-known model, and the attention mask (None: images)."""
    if isinstance(batch, Mapping):
        kwargs = {key: batch[key] for key in ("input_ids", "attention_mask", "token_type_ids") if key in batch}
        return (), kwargs, batch.get("attention_mask")
    x = batch[0] if isinstance(batch, (tuple, list)) else batch
    return (x,), {}, None


def hidden_states(
    model: nn.Module, blocks: Any, args: tuple, kwargs: dict, include_embeddings: bool
) -> dict[int, Tensor]:
    """Every block's output (the residual stream after it), keyed 1..L, in one forward pass without gradients.

    With ``include_embeddings`` the input of block 1 too, keyed 0. A model whose forward takes ``use_cache`` (the
    Hugging Face language models) runs with ``use_cache=False`` unless ``kwargs`` says otherwise.
    """
    import torch

    from layerwise.features.hooks import hooked_blocks

    outputs: dict[int, Tensor] = {}
    offset = int(include_embeddings)
    if "use_cache" not in kwargs and "use_cache" in inspect.signature(model.forward).parameters:
        kwargs = {**kwargs, "use_cache": False}  # only the blocks' outputs are read: building a KV cache is waste
    with torch.no_grad(), hooked_blocks(blocks, on_output=lambda i, h: outputs.__setitem__(i + offset, h.detach())):
        if include_embeddings:
            with hooked_blocks(blocks, on_input=lambda i, h: outputs.__setitem__(0, h.detach()), indices=[0]):
                model(*args, **kwargs)
        else:
            model(*args, **kwargs)
    return outputs


def token_features(
    outputs: dict[int, Tensor], mask: Optional[Tensor], mask_padding: bool = True, rows: Optional[int] = None
) -> Tensor:
    """(L, N, d): every layer's hidden states (B, T, d) at the real tokens (or every position) of the first ``rows``."""
    import torch

    stacked = torch.stack([outputs[index] for index in sorted(outputs)])  # (L, B, T, d)
    if rows is not None:
        stacked, mask = stacked[:, :rows], None if mask is None else mask[:rows]
    if stacked.dim() == 3:  # (L, B, d): pooled features, one row per sample
        return stacked
    if mask is not None and mask_padding:
        if mask.device != stacked.device:  # a mask still on the host: pick the rows there, no wait on the device
            index = mask.bool().flatten().nonzero().squeeze(1).to(stacked.device, non_blocking=True)
            return stacked.flatten(1, 2).index_select(1, index)
        return stacked[:, mask.bool()]
    return stacked.flatten(1, 2)


class UpdateStream:
    """Runs each batch's metric updates on a CUDA side stream, at most ``depth`` of them queued; inline elsewhere.

    A Hugging Face model waits on the device inside its forward (transformers 5 checks the position ids for packed
    sequences when it runs without a mask and a cache, and an attention mask for padding). On the forwards' stream,
    that wait would also wait for the previous batch's products, so they could never overlap the next batch's
    forwards: on an H100 at GPT-2-small's shape, the fast CKA's products then added their whole device time to every
    batch. On their own stream they run beside the next forwards. Memory stays bounded: before a new update is
    queued, the host waits for the one ``depth`` updates back, and a batch's features are kept until their update
    has run (``record_stream``). :meth:`join` makes the forwards' stream wait for every queued update (before
    ``compute``).
    """

    def __init__(self, device: torch.device, depth: int = 2) -> None:
        import torch

        self.device, self.depth = device, depth
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._queued: list[Any] = []  # one event per queued update, oldest first

    def run(self, metrics: Iterable[Any], *inputs: Tensor) -> None:
        """``metric.update(*inputs)`` for each metric; on CUDA queued on the side stream after what made ``inputs``."""
        if self.stream is None:
            _update_all(metrics, inputs)
            return
        import torch

        while len(self._queued) >= self.depth:
            self._queued.pop(0).synchronize()
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            _update_all(metrics, inputs)
        for tensor in inputs:
            tensor.record_stream(self.stream)
        self._queued.append(self.stream.record_event())

    def join(self) -> None:
        """The forwards' stream waits for every queued update (no host wait)."""
        if self.stream is not None:
            import torch

            torch.cuda.current_stream(self.device).wait_stream(self.stream)
            self._queued.clear()


def _update_all(metrics: Iterable[Any], inputs: tuple[Tensor, ...]) -> None:
    for metric in metrics:
        metric.update(*inputs)


def compare_models(
    model_a: nn.Module,
    model_b: nn.Module,
    batches: Iterable[Any],
    include_embeddings: bool = False,
    mask_padding: bool = True,
    minibatch: bool = False,
    chunk: int = 1024,
    progress: Any = None,
    pairs: str = "all",
    precision: str = "exact",
) -> dict[str, Any]:
    """Stream ``batches`` through both models (each on its own device) and return the comparison results.

    ``pairs="diagonal"``: only layer i of A against layer i of B (equal depths), the ``cka`` matrix NaN elsewhere.
    ``precision="fast"``: the exact CKA's products in float32, summed in float64 (see ``CrossModelCKA``).
    """
    import torch

    from layerwise.features.hf import input_device
    from layerwise.features.paths import get_blocks, layer_paths
    from layerwise.metrics.compare import CrossModelCKA, MinibatchCrossCKA
    from layerwise.metrics.functional_compare import arccos_distance

    blocks_a, blocks_b = get_blocks(model_a, layer_paths(model_a)), get_blocks(model_b, layer_paths(model_b))
    extra = int(include_embeddings)
    exact: Optional[CrossModelCKA] = None
    chunked = MinibatchCrossCKA(len(blocks_a) + extra, len(blocks_b) + extra, chunk) if minibatch else None
    device_a, device_b = input_device(model_a), input_device(model_b)
    for batch in batches:
        args, kwargs, mask = model_inputs(batch)
        if mask is not None and mask.device.type == "cpu" and bool(mask.all()):
            # No padding (packed text): the models run as without a mask, and nothing waits on the device for it
            # (a mask makes a Hugging Face model check it on the device, which stalls the host until the
            # previous batch's update has run). Checked on the host, where it is free.
            kwargs, mask = {key: value for key, value in kwargs.items() if key != "attention_mask"}, None
        on = [
            (model, blocks, device)
            for model, blocks, device in ((model_a, blocks_a, device_a), (model_b, blocks_b, device_b))
        ]
        features = []
        for model, blocks, device in on:
            # Asynchronous copies (the loaders pin memory on a GPU), so the host queues this batch's forwards while
            # the device still runs the previous batch's products.
            moved_args = tuple(value.to(device, non_blocking=True) for value in args)
            moved_kwargs = {key: value.to(device, non_blocking=True) for key, value in kwargs.items()}
            outputs = hidden_states(model, blocks, moved_args, moved_kwargs, include_embeddings)
            features.append(token_features(outputs, mask, mask_padding))
        a, b = features[0], features[1].to(features[0].device)
        if exact is None:
            with torch.device(a.device):  # the float64 states (793 MiB at GPT-2-small's shape) made where they live
                exact = CrossModelCKA(a.shape[0], a.shape[2], b.shape[0], b.shape[2], pairs=pairs, precision=precision)
            exact = exact.to(a.device)
            chunked = chunked.to(a.device) if chunked is not None else None
            updates = UpdateStream(a.device)
        updates.run([metric for metric in (exact, chunked) if metric is not None], a, b)
        if progress is not None:
            progress(1)
    if exact is None:
        raise ValueError("No batch to compare: the data is empty.")
    updates.join()
    cka = exact.compute()
    results: dict[str, Any] = {
        "layers_a": list(range(1 - extra, len(blocks_a) + 1)),
        "layers_b": list(range(1 - extra, len(blocks_b) + 1)),
        "num_tokens": int(exact.count),
        "mask_padding": mask_padding,
        "pairs": pairs,
        "precision": precision,
        "cka": cka,
        "arccos_distance": arccos_distance(cka) if cka.shape[0] == cka.shape[1] else None,
    }
    if chunked is not None:
        values = chunked.compute()
        results.update(minibatch_cka_mean=values["mean"], minibatch_cka_sum=values["sum"], chunk=chunk)
    return results


COMPARE_FILES = ("compare.json", "compare_cka.png")  # what `compare` writes into --out


def write_comparison(results: dict[str, Any], out: Path) -> list[Path]:
    """``compare.json`` and ``compare_cka.png`` in ``out``."""
    import matplotlib.pyplot as plt

    from layerwise.figures.compare import cka_across_models
    from layerwise.results import save_figure_atomic, to_json, write_text_atomic

    json_name, figure_name = COMPARE_FILES
    out.mkdir(parents=True, exist_ok=True)
    record = to_json(results)
    paths = [write_text_atomic(out / json_name, json.dumps(record, indent=1) + "\n")]
    figure = cka_across_models(record)
    try:
        paths.append(save_figure_atomic(out / figure_name, figure))
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

    from layerwise.results import check_outputs_free

    minimums = (("block_size", block_size, 2), ("batch_size", batch_size, 1), ("max_blocks", max_blocks, 1))
    for flag, value, least in minimums:
        if value < least:
            raise ValueError(f"`--{flag}={value}` must be >= {least}.")
    if chunk < 4:
        raise ValueError(f"`--chunk={chunk}` must be >= 4 (the unbiased HSIC needs 4 tokens per chunk).")
    TextSource(text, dataset, dataset_config).check()
    check_outputs_free(out, COMPARE_FILES, overwrite)
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
            first, second, loader, include_embeddings, True, minibatch, chunk, bar.update, pairs, precision
        )
    results = {"model_a": model_a, "model_b": model_b, **results}
    distance = results["arccos_distance"]
    print(
        f"{results['num_tokens']} tokens; mean diagonal CKA {float(results['cka'].diagonal().mean()):.4f}"
        + (f"; arccos distance {float(distance):.4f}" if distance is not None else "")
    )
    for path in write_comparison(results, out):
        print(path)
