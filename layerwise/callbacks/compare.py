"""Compare the trained model with a second, frozen model on every validation batch: CKA across models."""

from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any, Literal, Optional

import torch
from lightning.pytorch import LightningModule, Trainer
from torch import Tensor, nn
from torchmetrics import Metric

from layerwise.callbacks.lifecycle import AnalysisCallback
from layerwise.engines.checkpoint import load_model
from layerwise.engines.compare import hidden_states, model_inputs, token_features
from layerwise.features.hooks import hooked_blocks
from layerwise.features.paths import find_model, get_blocks, layer_paths, model_width
from layerwise.figures.summary import compare_figures
from layerwise.metrics.compare import CrossModelCKA, MinibatchCrossCKA
from layerwise.metrics.functional_compare import arccos_distance
from layerwise.metrics.functional_family import check_cross_measures

_OPTION = "--trainer.callbacks.model_b"
CrossMeasure = Literal["cca", "svcca", "pwcca", "procrustes", "shape", "effective_rank"]


class CrossModelComparison(AnalysisCallback):
    """CKA between every layer of the trained model (A) and every layer of a frozen model B, on the same tokens.

    Model B (a Hugging Face hub id or folder, or a layerwise ``.ckpt``) is loaded frozen, in eval mode, on the
    module's device. For every batch of the first validation dataloader, the outputs of A's blocks are taken with
    hooks during the module's own forward pass, B runs on the same batch, and the block outputs (the residual stream
    after each block; with ``include_embeddings`` also the input of block 1 as layer 0) at every real token (padding
    masked by the batch's ``attention_mask``; ``mask_padding=False`` keeps every position, the paper's behaviour)
    feed ``CrossModelCKA`` (exact, identical on 1 or n DDP processes, memory independent of the number of tokens)
    and, with ``minibatch``, ``MinibatchCrossCKA`` (chunks of ``chunk`` tokens, both aggregations).

    Writes the ``compare`` object of the epoch's summary JSON (``cka`` L_A x L_B, ``arccos_distance`` for models of
    equal depth, the minibatch matrices), logs ``val/compare/arccos_distance`` and ``val/compare/cka_diagonal_mean``,
    and draws the heatmap to TensorBoard (``log_figures``, on the figure schedule of the other callbacks).

    Args:
        model_b: hub id, local folder or layerwise checkpoint of model B (same tokenizer / inputs as A).
        include_embeddings: also compare the embedding output (layer 0).
        mask_padding: drop padded positions (default); ``False`` keeps them.
        minibatch: also compute the unbiased minibatch CKA.
        chunk: tokens per minibatch chunk.
        every_n_epochs: compare every n-th validation epoch while fitting (``validate`` always compares).
        dtype: load B in this dtype (``bfloat16``, ...); default as saved.
        log_figures: draw the CKA heatmap to TensorBoard (global rank zero).
        pairs: ``all`` layer pairs (the heatmap), or ``diagonal``: layer i of A with layer i of B only (equal depths;
            the arccos distance needs nothing else), L times less work and memory than all pairs.
        figures_every_n_epochs: while fitting, draw the heatmap only every n-th epoch and at the last one.
        precision: ``"exact"`` (float64 products, the default) or ``"fast"`` (each batch's products in float32,
            summed in float64; within 1e-4 of exact CKA, see :class:`~layerwise.metrics.CrossModelCKA`).
        measures: further measures from the same sums (``cca``, ``svcca``, ``pwcca``, ``procrustes``, ``shape``,
            ``effective_rank``; none by default), under ``measures`` of the ``compare`` object (L_A x L_B each;
            ``effective_rank_a``/``_b`` per layer), logged as ``val/compare/<measure>_diagonal_mean``.
        svcca_variance: the share of each layer's variance SVCCA keeps.
        shape_alpha: the shape metric's alpha (0: CCA, 1: Procrustes).
    """

    key = "compare"
    figures = staticmethod(compare_figures)

    def __init__(
        self,
        model_b: str,
        include_embeddings: bool = False,
        mask_padding: bool = True,
        minibatch: bool = False,
        chunk: int = 1024,
        every_n_epochs: int = 1,
        dtype: Optional[Literal["float32", "bfloat16", "float16", "float64"]] = None,
        log_figures: bool = True,
        pairs: Literal["all", "diagonal"] = "all",
        figures_every_n_epochs: int = 1,
        precision: Literal["exact", "fast"] = "exact",
        measures: Sequence[CrossMeasure] = (),
        svcca_variance: float = 0.99,
        shape_alpha: float = 0.5,
    ) -> None:
        super().__init__(every_n_epochs, log_figures, figures_every_n_epochs)
        self.measures = check_cross_measures(measures, svcca_variance, shape_alpha)
        self.svcca_variance, self.shape_alpha = float(svcca_variance), float(shape_alpha)
        if precision not in ("exact", "fast"):
            raise ValueError(f"`precision={precision!r}` must be 'exact' or 'fast'.")
        self.precision = precision
        if chunk < 4:
            raise ValueError(f"`chunk={chunk}` must be >= 4.")
        if pairs not in ("all", "diagonal"):
            raise ValueError(f"`pairs={pairs!r}` must be 'all' or 'diagonal'.")
        self.pairs = pairs
        self.model_b_name = model_b
        self.include_embeddings, self.mask_padding, self.minibatch = include_embeddings, mask_padding, minibatch
        self.chunk, self.dtype = chunk, dtype
        self._model_b: Optional[nn.Module] = None
        self._exact: Optional[CrossModelCKA] = None
        self._minibatch: Optional[MinibatchCrossCKA] = None
        self._stack: Optional[ExitStack] = None
        self._outputs_a: dict[int, Tensor] = {}

    # -- set-up --------------------------------------------------------------------------------------------------
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self._model_a = find_model(pl_module, "the LightningModule")
        self._blocks_a = get_blocks(self._model_a, layer_paths(self._model_a))
        self._model_b = load_model(self.model_b_name, _OPTION, dtype=self.dtype).eval().requires_grad_(False)
        self._blocks_b = get_blocks(self._model_b, layer_paths(self._model_b, _OPTION))

    def _build(self, device: torch.device) -> None:
        extra = int(self.include_embeddings)
        layers_a, layers_b = len(self._blocks_a) + extra, len(self._blocks_b) + extra
        if self.pairs == "diagonal" and layers_a != layers_b:
            raise ValueError(f"`pairs='diagonal'` needs models of equal depth; A has {layers_a}, B {layers_b} layers.")
        self._exact = CrossModelCKA(
            layers_a,
            model_width(self._model_a),
            layers_b,
            model_width(self._model_b),
            pairs=self.pairs,
            precision=self.precision,
            sync_on_compute=False,
        ).to(device)
        if self.minibatch:
            self._minibatch = MinibatchCrossCKA(layers_a, layers_b, self.chunk, sync_on_compute=False).to(device)

    def start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._model_b.to(pl_module.device)
        self._build(pl_module.device)

    def _collect(self, store: dict[int, Tensor], offset: int) -> Any:
        return lambda index, hidden: store.__setitem__(index + offset, hidden.detach())

    def before_batch(self, trainer: Trainer, pl_module: LightningModule, batch: Any) -> None:
        self._outputs_a = {}
        self._stack = ExitStack()
        extra = int(self.include_embeddings)
        self._stack.enter_context(hooked_blocks(self._blocks_a, on_output=self._collect(self._outputs_a, extra)))
        if extra:
            self._stack.enter_context(
                hooked_blocks(self._blocks_a, on_input=self._collect(self._outputs_a, 0), indices=[0])
            )

    def after_batch(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any) -> None:
        if self._stack is None:
            return
        self._stack.close()
        self._stack = None
        args, kwargs, mask = model_inputs(batch)
        outputs_b = hidden_states(self._model_b, self._blocks_b, args, kwargs, self.include_embeddings)
        # DistributedSampler's repeated samples at the end of this rank's stream are dropped
        rows = self.real_rows(next(iter(outputs_b.values())).shape[0])
        if not rows:
            return
        features_a = token_features(self._outputs_a, mask, self.mask_padding, rows)
        features_b = token_features(outputs_b, mask, self.mask_padding, rows)
        self._exact.update(features_a, features_b)
        if self._minibatch is not None:
            self._minibatch.update(features_a, features_b)

    def stop(self) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    # -- results -------------------------------------------------------------------------------------------------
    def metrics(self) -> list[Metric]:
        return [self._exact] + ([self._minibatch] if self._minibatch is not None else [])

    def compute(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, Any]:
        cka = self._exact.compute()
        results: dict[str, Any] = {
            "model_b": self.model_b_name,
            "layers_a": list(range(1 - int(self.include_embeddings), len(self._blocks_a) + 1)),
            "layers_b": list(range(1 - int(self.include_embeddings), len(self._blocks_b) + 1)),
            "num_tokens": int(self._exact.count),
            "mask_padding": self.mask_padding,
            "pairs": self.pairs,
            "cka": cka,
            "arccos_distance": arccos_distance(cka) if cka.shape[0] == cka.shape[1] else None,
        }
        if self._minibatch is not None:
            minibatch = self._minibatch.compute()
            results.update(minibatch_cka_mean=minibatch["mean"], minibatch_cka_sum=minibatch["sum"], chunk=self.chunk)
        if self.measures:
            results["measures"] = self._exact.compute_measures(self.measures, self.svcca_variance, self.shape_alpha)
            results["measure_options"] = {"svcca_variance": self.svcca_variance, "shape_alpha": self.shape_alpha}
        return results

    def scalars(self, results: dict[str, Any]) -> dict[str, float]:
        scalars = {"compare/cka_diagonal_mean": float(results["cka"].diagonal().mean())}
        if results["arccos_distance"] is not None:
            scalars["compare/arccos_distance"] = float(results["arccos_distance"])
        for name, values in results.get("measures", {}).items():
            if not name.startswith("effective_rank"):
                diagonal = torch.as_tensor(values, dtype=torch.float64).diagonal()
                scalars[f"compare/{name}_diagonal_mean"] = float(diagonal.nanmean())
        return scalars

    def line(self, results: dict[str, Any]) -> str:
        diagonal = [row[index] for index, row in enumerate(results["cka"]) if index < len(row)]
        mean = sum(float("nan") if value is None else value for value in diagonal) / len(diagonal)
        distance = results["arccos_distance"]
        return f"compare with {self.model_b_name}: mean diagonal CKA {mean:.4f}" + (
            f", arccos distance {distance:.4f}" if distance is not None else ""
        )
