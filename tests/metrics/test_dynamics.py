"""Block-dynamics metrics: mis-coupling, depth-wise coupling, spectra, LSS, expodistance, linearisation."""

import numpy as np
import pytest
import torch

from layerwise.metrics.dynamics import DepthCoupling, JacobianSpectrum, LinearisationCosine, TrajectoryShape
from layerwise.metrics.functional_dynamics import (
    coupling_score,
    depth_coupling,
    expodistance,
    line_shape_score,
    linearisation_cosine,
    mis_coupling,
    pairwise_mis_coupling,
    step_variation,
    top_singular,
)

D = 24


def orthogonal(dim: int, seed: int) -> torch.Tensor:
    q, _ = torch.linalg.qr(torch.randn(dim, dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
    return q


def with_spectrum(u: torch.Tensor, sigma: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return u @ torch.diag(sigma) @ v.T


def ref_mis_coupling(j1: np.ndarray, j2: np.ndarray, k: int, form: str) -> float:
    """numpy float64: SVD of J2, A = U2_K^T J1 V2_K, then the code or off-diagonal form."""
    u2, _, v2t = np.linalg.svd(j2)
    a = u2[:, :k].T @ j1 @ v2t[:k].T
    s1 = np.linalg.svd(j1, compute_uv=False)[:k]
    deviation = np.abs(a) - np.diag(s1) if form == "code" else a - np.diag(np.diag(a))
    return float(np.linalg.norm(deviation) / np.linalg.norm(s1))


@pytest.mark.parametrize("form", ["code", "offdiag"])
def test_mis_coupling_matches_numpy_and_its_invariances(form):
    g = torch.Generator().manual_seed(0)
    j1, j2 = torch.randn(D, D, generator=g, dtype=torch.float64), torch.randn(D, D, generator=g, dtype=torch.float64)
    value = mis_coupling(j1, j2, 5, form)
    np.testing.assert_allclose(value.item(), ref_mis_coupling(j1.numpy(), j2.numpy(), 5, form), rtol=1e-10)
    assert mis_coupling(j1, j1, 5, form).item() == pytest.approx(0.0, abs=1e-12)  # J1 = J2
    u, v = orthogonal(D, 1), orthogonal(D, 2)
    shared_a = with_spectrum(u, torch.linspace(5.0, 1.0, D, dtype=torch.float64), v)
    shared_b = with_spectrum(u, torch.linspace(9.0, 0.5, D, dtype=torch.float64) ** 2, v)
    assert mis_coupling(shared_a, shared_b, 5, form).item() == pytest.approx(0.0, abs=1e-12)  # shared bases
    signs = torch.ones(D, dtype=torch.float64)
    signs[::3] = -1.0
    flipped = with_spectrum(u * signs, torch.linspace(9.0, 0.5, D, dtype=torch.float64) ** 2, v * signs)
    torch.testing.assert_close(flipped, shared_b)  # (u_k, v_k) -> (-u_k, -v_k) is the same J2 ...
    u_flip = u.clone()
    u_flip[:, 1] *= -1  # ... and a J1 whose own vectors change sign is coupled as well, in the code form
    j1_flip = with_spectrum(u_flip, torch.linspace(5.0, 1.0, D, dtype=torch.float64), v)
    if form == "code":
        assert mis_coupling(j1_flip, shared_b, 5, form).item() == pytest.approx(0.0, abs=1e-12)
    torch.testing.assert_close(mis_coupling(3.7 * j1, j2, 5, form), value)  # scaling J1 by c > 0


def test_mis_coupling_of_independent_bases_is_close_to_one():
    d, k = 400, 5
    j1 = with_spectrum(orthogonal(d, 3), torch.linspace(2.0, 1.0, d, dtype=torch.float64), orthogonal(d, 4))
    j2 = with_spectrum(orthogonal(d, 5), torch.linspace(2.0, 1.0, d, dtype=torch.float64), orthogonal(d, 6))
    assert 0.9 < mis_coupling(j1, j2, k).item() < 1.1


def test_depth_coupling_matrix_and_score():
    g = torch.Generator().manual_seed(7)
    jacobians = torch.randn(4, D, D, generator=g, dtype=torch.float64)
    matrices = depth_coupling(jacobians, ks=(3, 8))
    assert matrices.shape == (2, 4, 4) and (matrices.diagonal(dim1=1, dim2=2) == 0).all()
    for index, k in enumerate((3, 8)):
        for i in range(4):
            for j in range(4):
                if i != j:
                    expected = ref_mis_coupling(jacobians[i].numpy(), jacobians[j].numpy(), k, "code")
                    assert matrices[index, i, j].item() == pytest.approx(expected, rel=1e-10)
    assert not torch.allclose(matrices[0], matrices[0].T)  # the basis comes from column j
    off = matrices[0][~torch.eye(4, dtype=torch.bool)]
    assert coupling_score(matrices)[0].item() == pytest.approx(-off.mean().item())
    metric = DepthCoupling(4, ks=(3, 8))
    metric.update(jacobians)
    metric.update(jacobians.flip(0))
    torch.testing.assert_close(metric.compute(), (matrices + depth_coupling(jacobians.flip(0), (3, 8))) / 2)
    torch.testing.assert_close(metric.score(), coupling_score(metric.compute()))


@pytest.mark.parametrize("form", ["code", "offdiag"])
def test_coupling_matrices_multiplied_once_for_the_largest_k_equal_one_product_per_k(form):
    """A_K = U_K^T J V_K is the top-left block of A_{max K}: one product for the largest K, as the K products were."""
    g = torch.Generator().manual_seed(17)
    a, b = (
        torch.randn(3, D, D, generator=g, dtype=torch.float64),
        torch.randn(5, D, D, generator=g, dtype=torch.float64),
    )
    ks = (8, 3, 24)  # unsorted, and K = d
    for first, second in ((a, b), (b, b)):
        basis = top_singular(second, max(ks))
        s_first = torch.linalg.svdvals(first)
        expected = []
        for k in ks:  # the formula before: one pair of products per K
            coupled = torch.einsum(
                "jdl,ijdk->ijlk", basis.u[..., :k], torch.einsum("ide,jek->ijdk", first, basis.v[..., :k])
            )
            if form == "code":
                deviation = coupled.abs() - torch.diag_embed(s_first[:, None, :k].expand(-1, len(second), -1))
            else:
                deviation = coupled - torch.diag_embed(coupled.diagonal(dim1=-2, dim2=-1))
            expected.append(deviation.square().sum(dim=(-2, -1)).sqrt() / s_first[:, None, :k].norm(dim=-1))
        torch.testing.assert_close(
            pairwise_mis_coupling(first, second, ks, form), torch.stack(expected), rtol=1e-12, atol=1e-14
        )


def test_randomized_svd_agrees_or_falls_back_and_says_so():
    u, v = orthogonal(60, 8), orthogonal(60, 9)
    sigma = torch.cat([torch.linspace(10.0, 5.0, 6, dtype=torch.float64), torch.full((54,), 1e-9, dtype=torch.float64)])
    decaying = with_spectrum(u, sigma, v)
    fast, full = top_singular(decaying, 5, method="randomized"), top_singular(decaying, 5)
    assert fast.method == "randomized"
    torch.testing.assert_close(fast.s, full.s, rtol=0, atol=1e-5)
    torch.testing.assert_close((fast.u * fast.v).sum(0).abs(), (full.u * full.v).sum(0).abs(), rtol=0, atol=1e-5)
    torch.testing.assert_close(fast.u.abs(), full.u.abs(), rtol=0, atol=1e-5)
    flat = torch.randn(60, 60, generator=torch.Generator().manual_seed(10), dtype=torch.float64)
    with pytest.warns(UserWarning, match="did not converge"):
        fallback = top_singular(flat, 5, method="randomized", niter=0, oversample=1)
    assert fallback.method.startswith("full")
    torch.testing.assert_close(fallback.s, top_singular(flat, 5).s)


def test_spectrum_and_linearisation():
    g = torch.Generator().manual_seed(11)
    weights = 0.3 * torch.randn(3, D, D, generator=g, dtype=torch.float64)
    x0 = torch.randn(D, generator=g, dtype=torch.float64)
    x = x0
    for weight in weights:  # a linear residual model: x^l = x^{l-1} + W_l x^{l-1}
        x = x + weight @ x
    assert linearisation_cosine(weights, x0, x).item() == pytest.approx(1.0, abs=1e-12)
    assert linearisation_cosine(weights, x0, -x).item() == pytest.approx(-1.0, abs=1e-12)
    metric = LinearisationCosine()
    metric.update(weights, x0, x)
    assert metric.compute().item() == pytest.approx(1.0)
    spectrum = JacobianSpectrum(3, top=4)
    spectrum.update(weights)
    expected = np.linalg.svd(weights.numpy(), compute_uv=False)[:, :4]
    np.testing.assert_allclose(spectrum.compute()["sigma"].numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(spectrum.compute()["inverse_sigma_1"].numpy(), 1 / expected[:, 0], rtol=1e-12)


def test_line_shape_score_and_expodistance():
    g = torch.Generator().manual_seed(12)
    direction = torch.randn(D, generator=g, dtype=torch.float64)
    start = torch.randn(D, generator=g, dtype=torch.float64)
    steps = torch.tensor([0.0, 1.0, 3.0, 7.0, 15.0, 31.0], dtype=torch.float64)  # geometric step norms 1, 2, 4, 8, 16
    straight = start + steps.view(-1, 1) * direction
    assert line_shape_score(straight).item() == pytest.approx(1.0, abs=1e-12)
    assert expodistance(straight).item() == pytest.approx(0.0, abs=1e-12)
    assert step_variation(straight).item() > 0.5
    equal = start + torch.arange(6.0, dtype=torch.float64).view(-1, 1) * direction
    assert step_variation(equal).item() == pytest.approx(0.0, abs=1e-12)
    back = straight.clone()
    back[3] = back[1]  # a step back
    assert line_shape_score(back).item() > 1.0
    q = orthogonal(D, 13)
    moved = 3.0 * back @ q.T + torch.randn(D, generator=g, dtype=torch.float64)  # rotation, scale, translation
    assert line_shape_score(moved).item() == pytest.approx(line_shape_score(back).item(), rel=1e-12)
    # reference LSS with the loop of the definition
    x_tilde = back[0].clone()
    for layer in range(1, 6):
        step = back[layer] - back[layer - 1]
        x_tilde = x_tilde + step / step.norm()
    assert line_shape_score(back).item() == pytest.approx(5 / (x_tilde - back[0]).norm().item(), rel=1e-12)
    norms = (back[1:] - back[:-1]).norm(dim=-1).numpy()
    beta = norms[1:] / norms[:-1]
    assert expodistance(back).item() == pytest.approx(beta.std() / beta.mean(), rel=1e-12)


def test_trajectory_shape_metric_is_the_mean_over_tokens():
    g = torch.Generator().manual_seed(14)
    trajectories = torch.randn(5, 9, D, generator=g, dtype=torch.float64).cumsum(0)
    metric = TrajectoryShape(4)
    metric.update(trajectories[:, :4])
    metric.update(trajectories[:, 4:])
    out = metric.compute()
    assert out["lss"].item() == pytest.approx(line_shape_score(trajectories).mean().item(), rel=1e-12)
    assert out["expodistance"].item() == pytest.approx(expodistance(trajectories).mean().item(), rel=1e-12)
    assert out["step_norm"].shape == (4,) and out["step_ratio"].shape == (3,)
    # the per-layer step statistics, against numpy on the definitions (the metric computes the steps once for all)
    steps = np.diff(trajectories.numpy(), axis=0)
    norms = np.linalg.norm(steps, axis=-1)  # (4, 9)
    np.testing.assert_allclose(out["step_norm"].numpy(), norms.mean(axis=1), rtol=1e-12)
    np.testing.assert_allclose(out["step_ratio"].numpy(), (norms[1:] / norms[:-1]).mean(axis=1), rtol=1e-12)
    variation = (norms.std(axis=0) / norms.mean(axis=0)).mean()
    np.testing.assert_allclose(out["step_variation"].item(), variation, rtol=1e-12)
    one_step = TrajectoryShape(1)  # one step: no ratio, expodistance undefined
    one_step.update(trajectories[:2])
    assert one_step.compute()["expodistance"].isnan() and one_step.compute()["lss"].item() == pytest.approx(1.0)


def test_exact_top_singular_equals_the_svd_also_when_ill_conditioned():
    u, v = orthogonal(D, 15), orthogonal(D, 16)
    for sigma in (torch.linspace(3.0, 0.5, D, dtype=torch.float64), torch.logspace(0, -9, D, dtype=torch.float64)):
        j = with_spectrum(u, sigma, v)  # the second has sigma_k / sigma_1 down to 1e-9: the SVD path
        top = top_singular(j, 12)
        torch.testing.assert_close(top.s, sigma[:12], rtol=1e-10, atol=0)
        torch.testing.assert_close(
            top.u @ torch.diag(top.s) @ top.v.T, with_spectrum(u[:, :12], sigma[:12], v[:, :12]), rtol=0, atol=1e-10
        )
