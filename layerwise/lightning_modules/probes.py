"""Linear probes on frozen features: how much of a downstream task each layer of a trained model already carries."""

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from typing import Any, NamedTuple, Optional

import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor, nn
from torch.utils.data import DistributedSampler

from layerwise._compat import built_by_lightning_cli
from layerwise.engines.checkpoint import frozen_backbone
from layerwise.engines.readout import Head, LayerOutputs, read_layers
from layerwise.errors import LayerwiseWarning
from layerwise.features import Backbone
from layerwise.lightning_modules.base import EvaluationSteps

WEIGHT_DECAYS = tuple(10.0 ** (k / 2) for k in range(-12, 1))  # 1e-6 .. 1, half a decade apart
NEWTON_MAX_PARAMETERS = 2048  # (d + 1) * num_classes up to this: exact Newton steps; beyond: L-BFGS


class LinearProbes(EvaluationSteps, LightningModule):
    """A frozen backbone and one linear classifier per layer, each fitted to convergence on its layer (App. B.4).

    Task transfer: train a model on one task, then probe every layer's frozen feature on another (the paper trains
    on ImageNet and probes on CIFAR; offline, digits 0-4 then 5-9). The backbone stays in evaluation mode (no
    dropout, frozen norms) and runs without gradients.

    The backbone is frozen, so the first training epoch only runs it over the training set and keeps every layer's
    feature (under DDP the ranks' features are gathered, the sampler's padding dropped, and the samples put in one
    order that does not depend on batching or shuffling, so every process fits the same heads). After its last batch,
    before that epoch's validation, each head ``Linear(d, num_classes)`` is fitted in float64 to the optimum of the
    L2-regularised multinomial logistic regression of its layer

        mean cross-entropy + weight_decay / 2 * ||W||^2        (the bias unpenalised)

    which is scikit-learn's ``LogisticRegression(C=1 / (weight_decay * n))`` on the same features (n training
    samples). The solver (:func:`fit_logistic`) is full-batch Newton with a line search when the head has at most
    2048 parameters (exact in a few steps, on one CPU thread), else full-batch L-BFGS, both on centred features.
    ``weight_decay`` is chosen per layer on held-out data (:func:`fit_probe`): a seeded ``holdout_fraction`` of the
    training samples is held out, the head is fitted on the rest for every value of ``weight_decays`` from the
    largest down (each fit warm-started from the previous one), the value with the best held-out accuracy wins
    (ties: the larger), and the head is refitted at it on all training samples. Later epochs change nothing (one
    epoch is enough).

    Evaluation follows the analysis contract (``features``, ``logits`` = every probe's logits, ``targets``), so
    :class:`~layerwise.callbacks.LayerwiseAnalysis` reports the per-layer probe accuracy as ``accuracy`` — the
    per-layer table — next to the COS/CKA of the frozen features.

    Memory: the training features of every layer, ``L x n x d`` in the backbone's dtype, plus one layer's in float64
    while it is fitted.

    Args:
        num_classes: classes of the downstream task.
        checkpoint: a ``layerwise fit`` checkpoint (``.ckpt``) whose backbone is probed.
        backbone: or the backbone itself (e.g. a pretrained ``TimmViT``/``HFEncoder``); exactly one of the two.
        weight_decays: the candidate L2 strengths (positive; default 1e-6 to 1, half a decade apart).
        holdout_fraction: fraction of the training samples held out to choose the weight decay.
        seed: seed of the held-out split.
        tolerance: a fit stops when the largest absolute entry of the objective's gradient is at most this.
        max_iter: most Newton or L-BFGS iterations per fit (a fit that stops there is warned about).

    Logged once, after the fit: ``train/loss`` (the fitted cross-entropy on all training samples, summed over
    layers), ``train/acc`` (last layer), ``probe/weight_decay/layer_XX``; at every validation ``val/loss``,
    ``val/acc`` (last layer's probe). The chosen decays are also the buffer ``weight_decay`` (L,), saved in
    checkpoints.
    """

    def __init__(
        self,
        num_classes: int,
        checkpoint: Optional[str] = None,
        backbone: Optional[Backbone] = None,
        weight_decays: Sequence[float] = WEIGHT_DECAYS,
        holdout_fraction: float = 0.2,
        seed: int = 0,
        tolerance: float = 1e-8,
        max_iter: int = 1000,
    ) -> None:
        super().__init__()
        option = "--model.init_args"
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"`{option}.num_classes={num_classes!r}` must be an integer >= 2.")
        weight_decays = list(weight_decays) if isinstance(weight_decays, (list, tuple)) else weight_decays
        if not weight_decays or not isinstance(weight_decays, list) or any(not _positive(w) for w in weight_decays):
            raise ValueError(
                f"`{option}.weight_decays={weight_decays!r}` must be a non-empty list of positive numbers."
            )
        if not (isinstance(holdout_fraction, (int, float)) and 0 < holdout_fraction < 1):
            raise ValueError(f"`{option}.holdout_fraction={holdout_fraction!r}` must lie strictly between 0 and 1.")
        if not _positive(tolerance):
            raise ValueError(f"`{option}.tolerance={tolerance!r}` must be a positive number.")
        if isinstance(max_iter, bool) or not isinstance(max_iter, int) or max_iter < 1:
            raise ValueError(f"`{option}.max_iter={max_iter!r}` must be a positive integer.")
        self.save_hyperparameters(ignore=[] if built_by_lightning_cli() else ["backbone"])
        backbone = frozen_backbone("LinearProbes", checkpoint, backbone)
        if backbone.token_level:
            raise ValueError("LinearProbes probes classifiers (one feature per sample), not token-level models.")
        self.backbone = backbone.requires_grad_(False).eval()
        self.num_classes = num_classes
        self.probes = nn.ModuleList(nn.Linear(backbone.embed_dim, num_classes) for _ in range(backbone.num_layers))
        self.weight_decays = tuple(sorted({float(w) for w in weight_decays}, reverse=True))
        self.holdout_fraction, self.seed = float(holdout_fraction), int(seed)
        self.tolerance, self.max_iter = float(tolerance), max_iter
        self.automatic_optimization = False  # the heads are fitted in closed loop, not stepped by an optimizer
        self.register_buffer("weight_decay", torch.full((backbone.num_layers,), math.nan, dtype=torch.float64))
        self._collected: list[tuple[Tensor, Tensor]] = []
        self._budget: Optional[int] = None

    def train(self, mode: bool = True) -> "LinearProbes":
        """Train the probes; the frozen backbone stays in evaluation mode."""
        super().train(mode)
        self.backbone.eval()
        return self

    @property
    def num_layers(self) -> int:
        """Number of probed layers L."""
        return self.backbone.num_layers

    @property
    def fitted(self) -> bool:
        """Whether the heads have been fitted (their weight decays are chosen; saved in checkpoints)."""
        return bool(torch.isfinite(self.weight_decay).all())

    def _features(self, batch: Any) -> tuple[Tensor, Optional[Tensor]]:
        inputs, targets = self.backbone.split_batch(batch)
        with torch.no_grad():
            features = self.backbone(inputs)
        return features, targets

    def probe_heads(self) -> list[Head]:
        """Every layer's probe as a head, ``(..., d)`` -> ``(..., num_classes)`` in the probe's dtype."""
        return [partial(_apply_probe, probe) for probe in self.probes]

    def probe_logits(self, features: Tensor) -> Tensor:
        """Every probe on its own layer: ``(L, B, d)`` -> ``(L, B, num_classes)``."""
        return torch.stack([head(h) for head, h in zip(self.probe_heads(), features)])

    def forward(self, inputs: Any) -> Tensor:
        """The logits of every layer's probe ``(L, B, num_classes)``."""
        with torch.no_grad():
            features = self.backbone(inputs)
        return self.probe_logits(features)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Probe checkpoints of the earlier minibatch fit have no ``weight_decay``: they count as not fitted."""
        checkpoint["state_dict"].setdefault("weight_decay", torch.full_like(self.weight_decay, math.nan))

    def on_train_epoch_start(self) -> None:
        self._collected = []
        self._budget = _real_samples_on_rank(self.trainer.train_dataloader)

    def training_step(self, batch: Any, batch_idx: int) -> None:
        self.optimizers().step()  # counts the step (checkpoints, logging intervals); changes nothing
        if self.fitted:
            return None
        features, targets = self._features(batch)
        rows = len(targets) if self._budget is None else min(len(targets), self._budget)
        self._budget = None if self._budget is None else self._budget - rows
        self._collected.append((features[:, :rows].detach().cpu(), targets[:rows].cpu()))
        return None

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.trainer.is_last_batch:  # before this epoch's validation
            self._fit_collected()

    def on_train_epoch_end(self) -> None:
        self._fit_collected()

    def _fit_collected(self) -> None:
        """Gather the features collected on every rank and fit every head (once)."""
        if self.fitted or not self._collected:
            return
        features = torch.cat([f for f, _ in self._collected], dim=1)  # (L, n, d)
        targets = torch.cat([t for _, t in self._collected])
        self._collected = []
        features, targets = self._gathered(features, targets)
        features, targets = canonical_order(features, targets, self.seed)
        device = self.probes[0].weight.device
        losses, accuracy, unconverged = [], math.nan, []
        for layer, probe in enumerate(self.probes):
            x = features[layer].to(device=device, dtype=torch.float64)
            y = targets.to(device)
            fit = fit_probe(
                x,
                y,
                self.num_classes,
                self.weight_decays,
                self.holdout_fraction,
                self.seed,
                self.tolerance,
                self.max_iter,
            )
            weight, bias = self.trainer.strategy.broadcast((fit.weight, fit.bias), src=0)  # every rank the same heads
            with torch.no_grad():
                probe.weight.copy_(weight.to(probe.weight))
                probe.bias.copy_(bias.to(probe.bias))
            self.weight_decay[layer] = fit.weight_decay
            if not fit.converged:
                unconverged.append(layer + 1)
            logits = x @ weight.T + bias
            losses.append(F.cross_entropy(logits, y))
            accuracy = float((logits.argmax(-1) == y).double().mean())
        if unconverged:
            rank_zero_warn(
                f"LinearProbes: the fit of layer(s) {unconverged} stopped at `--model.init_args.max_iter="
                f"{self.max_iter}` before the gradient fell below `--model.init_args.tolerance={self.tolerance}`.",
                category=LayerwiseWarning,
            )
        width = max(2, len(str(self.num_layers)))
        scalars = {f"probe/weight_decay/layer_{i:0{width}d}": float(w) for i, w in enumerate(self.weight_decay, 1)}
        scalars.update({"train/loss": float(torch.stack(losses).sum()), "train/acc": accuracy})
        self.log_dict(scalars, on_step=False, on_epoch=True)

    def _gathered(self, features: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """Every rank's samples ``(L, n, d)`` and ``(n,)``, in rank order; a collective under DDP."""
        if self.trainer.world_size <= 1:
            return features, targets
        device = self.device
        counts = self.all_gather(torch.tensor([len(targets)], device=device)).view(-1).tolist()
        longest = max(counts)
        padded = features.new_zeros(features.shape[0], longest, features.shape[2], device=device)
        padded[:, : len(targets)] = features.to(device)
        labels = torch.zeros(longest, dtype=torch.long, device=device)
        labels[: len(targets)] = targets.to(device)
        all_features, all_labels = self.all_gather(padded), self.all_gather(labels)  # (W, L, max, d), (W, max)
        features = torch.cat([all_features[r, :, :c] for r, c in enumerate(counts)], dim=1).cpu()
        return features, torch.cat([all_labels[r, :c] for r, c in enumerate(counts)]).cpu()

    @torch.no_grad()
    def layer_outputs(self, batch: Any) -> LayerOutputs:
        """The analysis contract: the frozen ``features``, every layer read by its own probe, ``targets``."""
        features, targets = self._features(batch)
        return read_layers(self.probe_heads(), features, targets)

    def setup(self, stage: str) -> None:
        data_classes = getattr(getattr(self.trainer, "datamodule", None), "num_classes", None)
        if data_classes is not None and data_classes != self.num_classes:
            raise ValueError(
                f"`--model.init_args.num_classes={self.num_classes}` but the data has {data_classes} classes; set "
                f"num_classes={data_classes}."
            )

    def configure_optimizers(self) -> torch.optim.Optimizer:
        """No optimizer moves the heads (they are fitted after the features are extracted): a step that only counts."""
        return _CountingStep(self.probes.parameters())


def _apply_probe(probe: nn.Linear, h: Tensor) -> Tensor:
    """One probe on features of its layer, cast to the probe's dtype."""
    return probe(h.to(probe.weight.dtype))


class _CountingStep(torch.optim.Optimizer):
    """An optimizer whose step changes nothing; Lightning counts it (checkpoints are not saved at step 0)."""

    def __init__(self, params: Any) -> None:
        super().__init__(params, {})

    def step(self, closure: Any = None) -> None:
        return None


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf


def _real_samples_on_rank(dataloader: Any) -> Optional[int]:
    """How many of this rank's training samples are real, not ``DistributedSampler``'s padding (None: all)."""
    sampler = getattr(dataloader, "sampler", None)
    inner = getattr(getattr(dataloader, "batch_sampler", None), "sampler", None)
    sampler = inner if isinstance(inner, DistributedSampler) else sampler
    if not isinstance(sampler, DistributedSampler) or sampler.drop_last:
        return None
    if sampler.total_size <= len(sampler.dataset):
        return None
    return len(range(sampler.rank, len(sampler.dataset), sampler.num_replicas))  # the padding comes last


def canonical_order(features: Tensor, targets: Tensor, seed: int) -> tuple[Tensor, Tensor]:
    """The samples sorted by a seeded random projection of their first layer's feature (then by target).

    The held-out split then takes the same samples however they were batched, shuffled or split over ranks.
    """
    generator = torch.Generator().manual_seed(seed)
    direction = torch.randn(features.shape[-1], generator=generator, dtype=torch.float64)
    key = features[0].to(torch.float64) @ direction
    order = torch.from_numpy(np.lexsort((targets.numpy(), key.numpy())))
    return features[:, order], targets[order]


class LogisticFit(NamedTuple):
    """A fitted head: ``weight`` (C, d), ``bias`` (C,), its ``weight_decay``, iterations, whether it converged."""

    weight: Tensor
    bias: Tensor
    weight_decay: float
    iterations: int
    converged: bool


def _objective(x: Tensor, onehot: Tensor, theta: Tensor, weight_decay: float) -> tuple[Tensor, Tensor, Tensor]:
    """Mean cross-entropy + weight_decay / 2 ||W||^2 at ``theta = [W^T; b]`` (d + 1, C), its gradient, and softmax."""
    weight, bias = theta[:-1], theta[-1]
    logits = x @ weight + bias
    log_norm = torch.logsumexp(logits, dim=1, keepdim=True)
    probabilities = torch.exp(logits - log_norm)
    loss = (log_norm.squeeze(1) - (logits * onehot).sum(1)).mean() + 0.5 * weight_decay * weight.pow(2).sum()
    residual = (probabilities - onehot) / len(x)
    gradient = torch.cat([x.T @ residual + weight_decay * weight, residual.sum(0, keepdim=True)])
    return loss, gradient, probabilities


def _hessian(x: Tensor, probabilities: Tensor, weight_decay: float, chunk: int = 4096) -> Tensor:
    """The objective's Hessian in ``theta`` flattened row-major ((d + 1) C, (d + 1) C), made positive definite.

    The unpenalised bias has one flat direction (the same shift for every class); a rank-one term on it fixes it
    without changing the step in any other direction (the gradient is orthogonal to it).
    """
    n, d = x.shape
    classes = probabilities.shape[1]
    size = (d + 1) * classes
    hessian = x.new_zeros(size, size)
    for start in range(0, n, chunk):
        rows = torch.cat([x[start : start + chunk], x.new_ones(len(x[start : start + chunk]), 1)], dim=1)
        p = probabilities[start : start + chunk]
        weighted = (rows[:, :, None] * p[:, None, :]).reshape(len(rows), size)  # x_a p_j
        hessian -= weighted.T @ weighted  # - x_a x_b p_j p_k
        block = torch.einsum("ij,ia,ib->jab", p, rows, rows)  # + delta_jk x_a x_b p_j
        view = hessian.view(d + 1, classes, d + 1, classes)
        for j in range(classes):
            view[:, j, :, j] += block[j]
    hessian /= n
    penalty = torch.full((d + 1, classes), weight_decay, dtype=x.dtype, device=x.device)
    penalty[-1] = 0
    hessian += torch.diag(penalty.reshape(-1))
    bias = torch.arange(d * classes, size, device=x.device)
    hessian[bias[:, None], bias[None, :]] += 1.0 / classes
    return hessian


def _newton(x: Tensor, onehot: Tensor, theta: Tensor, weight_decay: float, tolerance: float, max_iter: int):
    loss, gradient, probabilities = _objective(x, onehot, theta, weight_decay)
    for iteration in range(max_iter + 1):
        if gradient.abs().max() <= tolerance:
            return theta, iteration, True
        if iteration == max_iter:
            break
        hessian = _hessian(x, probabilities, weight_decay)
        factor, info = torch.linalg.cholesky_ex(hessian)
        if info:  # numerically indefinite: a damped step
            factor = torch.linalg.cholesky(hessian + 1e-8 * hessian.diagonal().max() * torch.eye(len(hessian)).to(x))
        step = -torch.cholesky_solve(gradient.reshape(-1, 1), factor).view_as(theta)
        slope, size = float((gradient * step).sum()), 1.0
        while True:  # backtracking (Armijo); full Newton steps near the optimum
            candidate = theta + size * step
            new_loss, new_gradient, new_probabilities = _objective(x, onehot, candidate, weight_decay)
            if new_loss <= loss + 1e-4 * size * slope or size < 1e-10:
                break
            size *= 0.5
        if size < 1e-10 and new_loss > loss:  # no decrease left at machine precision
            return theta, iteration, bool(gradient.abs().max() <= 10 * tolerance)
        theta, loss, gradient, probabilities = candidate, new_loss, new_gradient, new_probabilities
    return theta, max_iter, False


def _lbfgs(x: Tensor, onehot: Tensor, theta: Tensor, weight_decay: float, tolerance: float, max_iter: int):
    theta = theta.clone()
    optimizer = torch.optim.LBFGS(
        [theta],
        lr=1,
        max_iter=max_iter,
        max_eval=2 * max_iter,
        history_size=20,
        tolerance_grad=tolerance,
        tolerance_change=0.0,
        line_search_fn="strong_wolfe",
    )

    def closure() -> Tensor:
        loss, gradient, _ = _objective(x, onehot, theta.detach(), weight_decay)
        theta.grad = gradient
        return loss

    optimizer.step(closure)
    _, gradient, _ = _objective(x, onehot, theta.detach(), weight_decay)
    iterations = optimizer.state[theta].get("n_iter", 0)
    return theta.detach(), iterations, bool(gradient.abs().max() <= tolerance)


@contextmanager
def _one_thread() -> Iterator[None]:
    """One intra-op thread on the CPU (a contended machine makes a 2-thread Newton fit 8 times slower), restored."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def fit_logistic(
    x: Tensor,
    targets: Tensor,
    num_classes: int,
    weight_decay: float,
    start: Optional[Tensor] = None,
    tolerance: float = 1e-8,
    max_iter: int = 1000,
) -> LogisticFit:
    """The argmin of mean cross-entropy + weight_decay / 2 ||W||^2 over ``W`` (C, d) and ``b`` (C,), in float64.

    scikit-learn's ``LogisticRegression(C=1 / (weight_decay * n))`` (multinomial, intercept unpenalised) minimises
    the same objective. Solved on centred features (an exact change of the bias, the penalty unchanged) by Newton's
    method with a backtracking line search when ``(d + 1) * num_classes <= 2048``, else by L-BFGS with a strong
    Wolfe line search; ``start`` (``theta = [W^T; b]``, (d + 1, C)) warm-starts it. The bias is returned with zero
    mean over classes (the objective does not depend on that mean).
    """
    x = x.to(torch.float64)
    mean = x.mean(0)
    centred = x - mean
    onehot = F.one_hot(targets.long(), num_classes).to(x)
    theta = x.new_zeros(x.shape[1] + 1, num_classes) if start is None else start.to(x).clone()
    theta[-1] += mean @ theta[:-1]  # the same logits on centred features
    if theta.numel() <= NEWTON_MAX_PARAMETERS:  # small dense products: more threads cost more than they save
        with _one_thread():
            theta, iterations, converged = _newton(centred, onehot, theta, float(weight_decay), tolerance, max_iter)
    else:
        theta, iterations, converged = _lbfgs(centred, onehot, theta, float(weight_decay), tolerance, max_iter)
    bias = theta[-1] - mean @ theta[:-1]
    bias = bias - bias.mean()
    return LogisticFit(theta[:-1].T.contiguous(), bias, float(weight_decay), iterations, converged)


def fit_probe(
    features: Tensor,
    targets: Tensor,
    num_classes: int,
    weight_decays: Sequence[float] = WEIGHT_DECAYS,
    holdout_fraction: float = 0.2,
    seed: int = 0,
    tolerance: float = 1e-8,
    max_iter: int = 1000,
) -> LogisticFit:
    """One layer's probe, its weight decay chosen on held-out samples, then refitted on all of them.

    ``features`` (n, d) and ``targets`` (n,) in a fixed order. A seeded ``holdout_fraction`` of them is held out;
    :func:`fit_logistic` fits the rest at every weight decay from the largest down, each fit warm-started from the
    previous; the decay with the best held-out accuracy wins (ties: the larger) and is refitted on all samples,
    warm-started from its held-out fit.
    """
    x, y = features.to(torch.float64), targets.long()
    n = len(y)
    held = min(n - 1, max(1, round(holdout_fraction * n)))
    permutation = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).to(y.device)
    holdout, rest = permutation[:held], permutation[held:]
    best: Optional[tuple[int, LogisticFit]] = None
    fit: Optional[LogisticFit] = None
    for decay in sorted(set(weight_decays), reverse=True):
        start = None if fit is None else torch.cat([fit.weight.T, fit.bias[None]])
        fit = fit_logistic(x[rest], y[rest], num_classes, decay, start, tolerance, max_iter)
        correct = int(((x[holdout] @ fit.weight.T + fit.bias).argmax(-1) == y[holdout]).sum())
        if best is None or correct > best[0]:
            best = (correct, fit)
    chosen = best[1]
    start = torch.cat([chosen.weight.T, chosen.bias[None]])
    return fit_logistic(x, y, num_classes, chosen.weight_decay, start, tolerance, max_iter)
