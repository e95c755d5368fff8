"""Two models over a stream of batches: every block's output of each, at the real tokens, into the CKA across models.

What the ``compare`` command and the ``CrossModelComparison`` callback share. Torch is imported inside the functions:
the command's module imports this one at its top, and its ``--help`` imports no torch.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
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
    measures: Sequence[str] = (),
    svcca_variance: float = 0.99,
    shape_alpha: float = 0.5,
) -> dict[str, Any]:
    """Stream ``batches`` through both models (each on its own device) and return the comparison results.

    ``pairs="diagonal"``: only layer i of A against layer i of B (equal depths), the ``cka`` matrix NaN elsewhere.
    ``precision="fast"``: the exact CKA's products in float32, summed in float64 (see ``CrossModelCKA``).
    ``measures``: the further second-moment measures from the same sums (``CrossModelCKA.compute_measures``), each
    under its name in ``measures`` of the results.
    """
    import torch

    from layerwise.features.hf import input_device
    from layerwise.features.paths import get_blocks, layer_paths
    from layerwise.metrics.compare import CrossModelCKA, MinibatchCrossCKA
    from layerwise.metrics.functional_compare import arccos_distance
    from layerwise.metrics.functional_family import check_cross_measures

    measures = check_cross_measures(measures, svcca_variance, shape_alpha)  # before any forward
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
    if measures:
        results["measures"] = exact.compute_measures(measures, svcca_variance, shape_alpha)
        results["measure_options"] = {"svcca_variance": svcca_variance, "shape_alpha": shape_alpha}
    return results
