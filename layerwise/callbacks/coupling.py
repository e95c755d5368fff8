"""Watch block coupling emerge during training: depth-wise coupling of a fixed set of validation prompts."""

import math
from collections.abc import Sequence
from typing import Any, Literal, Optional, Union

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import move_data_to_device

from layerwise.callbacks.lifecycle import AnalysisCallback
from layerwise.engines.coupling import CouplingAnalysis, Token
from layerwise.engines.sampling import evaluation_loaders
from layerwise.figures.coupling import coupling_figures


class BlockCoupling(AnalysisCallback):
    """Depth-wise coupling of the block Jacobians on the first ``n_samples`` validation samples, every n epochs.

    At the end of an analysed validation epoch, each of the first ``n_samples`` samples of the first validation
    dataloader's dataset is run alone through the model (eval mode, padding removed); the exact Jacobians
    ``J^l_{tt}`` of every block at the chosen token give the L x L mis-coupling matrix for every K (see
    :mod:`layerwise.metrics.functional_dynamics`), averaged over the samples, with the singular spectra, the
    linearisation cosine and the trajectory shape (LSS, expodistance; mean over all tokens of the samples).

    Under DDP the samples are split over the ranks (sample i on rank i % world size) and the float64 sums are
    all-reduced, so the result is the same on 1 or n processes. The model must fit on one device per process
    (each rank runs its own samples). Unlike the other analyses it feeds on no validation batch: the whole analysis
    runs in :meth:`compute`, at the end of the validation epoch.

    Outputs: the ``coupling`` key of the epoch's summary JSON (``<log_dir>/layerwise/val_epoch_..._step_....json``),
    the scalars ``val/coupling/score_k<K>``, ``val/coupling/lss``, ``val/coupling/expodistance`` and
    ``val/coupling/linearisation_cosine``, and the heatmap/spectra figures in TensorBoard (``log_figures``).

    Args:
        every_n_epochs: analyse every n-th validation epoch while fitting (``validate`` always analyses).
        n_samples: how many validation samples (the same ones every time).
        tokens: the token whose Jacobians are taken: ``"last"`` (the last real token), ``"first"`` or an index.
        ks: numbers K of top singular vectors (each at most the width d).
        form: mis-coupling form, ``"code"`` (the authors') or ``"offdiag"``.
        method: ``"full"`` SVD or ``"randomized"`` (checked against a residual bound; falls back with a warning).
        log_figures: draw the heatmap and spectra as images in every logger (PNG files without one; global rank zero).
        chunk_size: JVPs run at once per block (default all d); lower it to bound the memory of wide models.
        figures_every_n_epochs: while fitting, draw the figures only every n-th epoch and at the last one.
    """

    key = "coupling"
    figures = staticmethod(coupling_figures)

    def __init__(
        self,
        every_n_epochs: int = 1,
        n_samples: int = 8,
        tokens: Token = "last",
        ks: Sequence[int] = (10, 30, 50),
        form: Literal["code", "offdiag"] = "code",
        method: Literal["full", "randomized"] = "full",
        log_figures: bool = True,
        chunk_size: Optional[int] = None,
        figures_every_n_epochs: int = 1,
    ) -> None:
        super().__init__(every_n_epochs, log_figures, figures_every_n_epochs)
        if isinstance(n_samples, bool) or not isinstance(n_samples, int) or n_samples < 1:
            raise ValueError(f"`n_samples={n_samples!r}` must be a positive int.")
        if not ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks):
            raise ValueError(f"`ks={ks!r}` must be a non-empty list of positive ints.")
        if form not in ("code", "offdiag"):
            raise ValueError(f"`form={form!r}` must be 'code' or 'offdiag'.")
        if method not in ("full", "randomized"):
            raise ValueError(f"`method={method!r}` must be 'full' or 'randomized'.")
        self.n_samples = n_samples
        self.tokens: Union[str, int] = tokens
        self.ks = tuple(ks)
        self.form, self.method = form, method
        if chunk_size is not None and (
            isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size < 1
        ):
            raise ValueError(f"`chunk_size={chunk_size!r}` must be a positive int or null.")
        self.chunk_size = chunk_size
        self._analysis: Optional[CouplingAnalysis] = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self._analysis = CouplingAnalysis(
            pl_module, self.ks, self.tokens, self.form, self.method, chunk_size=self.chunk_size
        )

    def compute(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, Any]:
        with torch.inference_mode(False):  # Lightning evaluates in inference mode; states must be normal tensors
            return self._analyse(trainer, pl_module)

    def scalars(self, results: dict[str, Any]) -> dict[str, float]:
        scalars = {f"coupling/score_k{k}": float(score) for k, score in zip(self.ks, results["coupling_score"])}
        scalars["coupling/lss"] = float(results["trajectory_lss"])
        scalars["coupling/expodistance"] = float(results["trajectory_expodistance"])
        scalars["coupling/linearisation_cosine"] = float(results["linearisation_cosine"])
        return scalars

    def _analyse(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, Any]:
        analysis = self._analysis
        analysis.reset()
        analysis.to(pl_module.device)  # NCCL reduces device tensors only
        loader = self.loader if self.loader is not None else evaluation_loaders(trainer.val_dataloaders)[0]
        dataset = loader.dataset
        count = min(self.n_samples, len(dataset))
        # Every rank analyses as many prompts (the last ones padded, not counted): under FSDP2 every block call is a
        # collective, so ranks with different numbers of prompts would wait for each other forever.
        for index in range(
            trainer.global_rank, math.ceil(count / trainer.world_size) * trainer.world_size, trainer.world_size
        ):
            batch = loader.collate_fn([dataset[index % count]])
            analysis.add(move_data_to_device(batch, pl_module.device), counted=index < count)
        analysis.reduce()
        return analysis.results()

    def line(self, results: dict[str, Any]) -> str:
        score = ", ".join(f"K={k}: {float(s):.3f}" for k, s in zip(self.ks, results["coupling_score"]))
        return f"block coupling ({results['num_prompts']} prompts): {score}; LSS {float(results['trajectory_lss']):.3f}"
