"""Metrics of block dynamics, averaged over prompts/tokens with float64 sum states (exact under DDP).

The math is in :mod:`layerwise.metrics.functional_dynamics`; these classes only hold sums and counts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from layerwise.metrics._base import _check_positive_int, _SumStateMetric
from layerwise.metrics.functional_dynamics import (
    CouplingForm,
    SvdMethod,
    _trajectory_statistics,
    coupling_score,
    depth_coupling,
    linearisation_cosine,
    singular_spectra,
)


def _check_jacobians(jacobians: Tensor, num_layers: int) -> None:
    if jacobians.dim() != 3 or jacobians.shape[0] != num_layers or jacobians.shape[1] != jacobians.shape[2]:
        raise ValueError(f"Expected Jacobians of shape ({num_layers}, d, d), got {tuple(jacobians.shape)}.")


class DepthCoupling(_SumStateMetric):
    """Depth-wise mis-coupling matrices ``M[K, i, j] = m_K(J^i_{tt}, J^j_{tt})`` averaged over prompts.

    Args:
        num_layers: L.
        ks: the numbers K of top singular vectors (each at most d).
        form: ``"code"`` (the authors' code, default) or ``"offdiag"``.
        method: ``"full"`` SVD or ``"randomized"`` (checked, falls back to full with a warning).
        kwargs: torchmetrics ``Metric`` options.

    Shapes:
        ``update(jacobians)``: (L, d, d), the Jacobians of one prompt at one token. ``compute()``: (len(ks), L, L)
        float64; :meth:`score` gives the coupling score per K (minus the mean off-diagonal mis-coupling).
    """

    def __init__(
        self,
        num_layers: int,
        ks: Sequence[int] = (10, 30, 50),
        form: CouplingForm = "code",
        method: SvdMethod = "full",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.num_layers = _check_positive_int("num_layers", num_layers)
        self.ks = tuple(_check_positive_int("ks", k) for k in ks)
        if not self.ks:
            raise ValueError("Expected at least one K in `ks`.")
        if form not in ("code", "offdiag"):
            raise ValueError(f"`form` must be 'code' or 'offdiag', got {form!r}.")
        self.form, self.method = form, method
        self._add_sum_state("matrix_sum", (len(self.ks), num_layers, num_layers))
        self._add_sum_state("count", ())

    def update(self, jacobians: Tensor) -> None:
        """Add the depth-wise matrices of one prompt's Jacobians (L, d, d)."""
        _check_jacobians(jacobians, self.num_layers)
        if max(self.ks) > jacobians.shape[-1]:
            raise ValueError(f"`ks`={self.ks}: every K must be at most the width d={jacobians.shape[-1]}.")
        self.matrix_sum += depth_coupling(jacobians, self.ks, self.form, self.method).to(self.matrix_sum.device)
        self.count += 1

    def compute(self) -> Tensor:
        """Mean mis-coupling matrices (len(ks), L, L) float64."""
        return self.matrix_sum / self.count

    def score(self) -> Tensor:
        """Coupling score per K (len(ks),): minus the mean off-diagonal mis-coupling."""
        return coupling_score(self.compute())


class JacobianSpectrum(_SumStateMetric):
    """Mean top singular values (L, top) of the block Jacobians, and the mean of 1/sigma_1 per block (L,)."""

    def __init__(self, num_layers: int, top: int = 15, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_layers = _check_positive_int("num_layers", num_layers)
        self.top = _check_positive_int("top", top)
        self._add_sum_state("sigma_sum", (num_layers, top))
        self._add_sum_state("inverse_top_sum", (num_layers,))
        self._add_sum_state("count", ())

    def update(self, jacobians: Tensor) -> None:
        """Add one prompt's Jacobians (L, d, d)."""
        _check_jacobians(jacobians, self.num_layers)
        sigma = singular_spectra(jacobians, self.top).to(self.sigma_sum.device)
        self.sigma_sum[:, : sigma.shape[1]] += sigma
        self.inverse_top_sum += 1.0 / sigma[:, 0]
        self.count += 1

    def compute(self) -> dict[str, Tensor]:
        """``sigma`` (L, top) and ``inverse_sigma_1`` (L,), float64 means over prompts."""
        return {"sigma": self.sigma_sum / self.count, "inverse_sigma_1": self.inverse_top_sum / self.count}


class LinearisationCosine(_SumStateMetric):
    """Mean over prompts of ``cos(prod_l (I + J^l) x^0, x^L)`` at one token."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._add_sum_state("cos_sum", ())
        self._add_sum_state("count", ())

    def update(self, jacobians: Tensor, first: Tensor, last: Tensor) -> None:
        """Add one prompt: Jacobians (L, d, d), x^0 (d,) and x^L (d,) of the token."""
        self.cos_sum += linearisation_cosine(jacobians, first, last).to(self.cos_sum.device)
        self.count += 1

    def compute(self) -> Tensor:
        return self.cos_sum / self.count


class TrajectoryShape(_SumStateMetric):
    """Line-shape score, expodistance and step statistics of token trajectories, averaged over tokens.

    Args:
        num_layers: L (trajectories have L+1 points, ``x^0`` the embeddings).

    Shapes:
        ``update(trajectories)``: (L+1, N, d) for N tokens (or samples). ``compute()``: a dict of float64 tensors:
        ``lss``, ``expodistance``, ``step_variation`` (means over tokens), ``step_norm`` (L,) and ``step_ratio``
        (L-1,) (per-layer means). Expodistance needs L >= 2 (NaN otherwise).
    """

    def __init__(self, num_layers: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_layers = _check_positive_int("num_layers", num_layers)
        self._add_sum_state("lss_sum", ())
        self._add_sum_state("expodistance_sum", ())
        self._add_sum_state("variation_sum", ())
        self._add_sum_state("step_norm_sum", (num_layers,))
        self._add_sum_state("step_ratio_sum", (max(num_layers - 1, 0),))
        self._add_sum_state("count", ())

    def update(self, trajectories: Tensor) -> None:
        """Add the trajectories (L+1, N, d) of N tokens."""
        if trajectories.dim() != 3 or trajectories.shape[0] != self.num_layers + 1:
            raise ValueError(
                f"Expected trajectories of shape ({self.num_layers + 1}, N, d), got {tuple(trajectories.shape)}."
            )
        device = self.count.device
        lss, variation, norms, ratios, expo = _trajectory_statistics(trajectories)  # the steps once, not five times
        self.lss_sum += lss.sum().to(device)
        self.variation_sum += variation.sum().to(device)
        self.step_norm_sum += norms.sum(dim=1).to(device)
        if ratios is not None and expo is not None:
            self.expodistance_sum += expo.sum().to(device)
            self.step_ratio_sum += ratios.sum(dim=1).to(device)
        self.count += trajectories.shape[1]

    def compute(self) -> dict[str, Tensor]:
        nan = torch.full_like(self.count, float("nan"))
        return {
            "lss": self.lss_sum / self.count,
            "expodistance": self.expodistance_sum / self.count if self.num_layers >= 2 else nan,
            "step_variation": self.variation_sum / self.count,
            "step_norm": self.step_norm_sum / self.count,
            "step_ratio": self.step_ratio_sum / self.count,
        }
