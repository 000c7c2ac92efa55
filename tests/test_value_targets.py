"""Stop Regressing's target projections by hand: two-hot weights, HL-Gauss bin masses, the
expectations, and the losses."""

import math

import pytest
import torch

from agentrl_lib.algorithms import value_targets as vt

Z = torch.tensor([-1.0, 0.0, 1.0, 2.0], dtype=torch.float64)


def test_two_hot_by_hand():
    p = vt.two_hot(torch.tensor([0.3, -1.0, 2.0, 5.0, -7.0, 1.0]), Z)
    want = [[0, 0.7, 0.3, 0], [1, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 1], [1, 0, 0, 0], [0, 0, 1, 0]]
    assert torch.allclose(p, torch.tensor(want, dtype=torch.float64))
    assert torch.allclose(vt.expectation(p, Z), torch.tensor([0.3, -1, 2, 2, -1, 1.0], dtype=torch.float64))


def test_two_hot_on_an_uneven_support():
    z = torch.tensor([0.0, 1.0, 4.0], dtype=torch.float64)
    p = vt.two_hot(torch.tensor([2.5]), z)  # 2.5 = 0.5 * 1 + 0.5 * 4
    assert torch.allclose(p, torch.tensor([[0.0, 0.5, 0.5]], dtype=torch.float64))


def phi(x):
    return 0.5 * (1 + math.erf(x / math.sqrt(2)))


def test_hl_gauss_by_hand():
    sigma = 0.5
    p = vt.hl_gauss(torch.tensor([0.2]), Z, sigma)[0]
    edges = [-1.5, -0.5, 0.5, 1.5, 2.5]
    mass = [phi((edges[k + 1] - 0.2) / sigma) - phi((edges[k] - 0.2) / sigma) for k in range(4)]
    want = torch.tensor(mass, dtype=torch.float64) / sum(mass)
    assert torch.allclose(p, want, atol=1e-12)
    assert abs(float(p.sum()) - 1) < 1e-12
    # symmetric around a support point; a narrow Gaussian is one-hot
    q = vt.hl_gauss(torch.tensor([0.0]), Z, 0.3)[0]
    assert torch.isclose(q[0], q[2]) and q[1] > 0.9
    assert vt.hl_gauss(torch.tensor([1.0]), Z, 1e-3)[0].tolist() == pytest.approx([0, 0, 1, 0])
    # the expectation is near y inside the support, pulled inward at its edge
    e = vt.expectation(vt.hl_gauss(torch.tensor([0.3, 1.9]), Z, 0.75), Z)
    assert abs(float(e[0]) - 0.3) < 0.05 and float(e[1]) < 1.9


def test_losses():
    y = torch.tensor([0.3, 1.0], dtype=torch.float64)
    assert float(vt.value_loss(torch.tensor([0.0, 2.0], dtype=torch.float64), y, "mse")) == pytest.approx((0.09 + 1) / 2)
    logits = torch.zeros(2, 4, dtype=torch.float64)  # uniform prediction: CE = log K
    for kind in ("two_hot", "hl_gauss"):
        assert float(vt.value_loss(logits, y, kind, Z)) == pytest.approx(math.log(4))
    # the cross-entropy is smallest at logits = log target (it equals the target's entropy there)
    t = vt.two_hot(y, Z)
    best = vt.value_loss(torch.log(t.clamp_min(1e-12)), y, "two_hot", Z)
    ent = float(-(t * torch.log(t.clamp_min(1e-12))).sum(1).mean())
    assert float(best) == pytest.approx(ent, abs=1e-9)
    with pytest.raises(ValueError, match="unknown value loss"):
        vt.value_loss(logits, y, "huber", Z)
    with pytest.raises(ValueError, match="support of K"):
        vt.value_loss(logits, y, "two_hot", Z[:3])
    with pytest.raises(ValueError, match="sigma"):
        vt.hl_gauss(y, Z, 0.0)
    assert torch.allclose(vt.uniform_support(-1, 2, 4), Z)


def _hl_gauss_exact(y: float, sigma: float) -> list[float]:
    """HL-Gauss on Z at 60 digits (mpmath, whose exponents are unbounded: no underflow)."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 60
    edges = [-1.5, -0.5, 0.5, 1.5, 2.5]
    mass = [mpmath.ncdf((edges[k + 1] - mpmath.mpf(y)) / sigma)
            - mpmath.ncdf((edges[k] - mpmath.mpf(y)) / sigma) for k in range(4)]
    return [float(m / sum(mass)) for m in mass]


@pytest.mark.parametrize("k", [8, 20, 1e6])
@pytest.mark.parametrize("sigma", [0.5, 0.75])
def test_hl_gauss_far_outside_the_support(k, sigma):
    # k sigma beyond each outer edge (-1.5 and 2.5): the erf difference gave an all-zero row from
    # about 8 sigma on, so value_loss was 0 with a zero gradient and the target was ignored
    y = torch.tensor([-1.5 - k * sigma, 2.5 + k * sigma], dtype=torch.float64)
    p = vt.hl_gauss(y, Z, sigma)
    assert torch.isfinite(p).all() and torch.allclose(p.sum(1), torch.ones(2, dtype=torch.float64))
    assert p[0].argmax() == 0 and p[1].argmax() == 3  # the nearest edge bin
    assert float(p[0, 0]) > 0.999 and float(p[1, 3]) > 0.999
    assert torch.allclose(p[0], p[1].flip(0), atol=1e-15)  # the two edges mirror each other
    exact = _hl_gauss_exact(float(y[1]), sigma)  # the neighbours' tiny masses too, to 1e-9
    assert p[1].tolist() == pytest.approx(exact, rel=1e-9, abs=1e-300)
    logits = torch.zeros(2, 4, dtype=torch.float64, requires_grad=True)
    loss = vt.value_loss(logits, y, "hl_gauss", Z, sigma)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(math.log(4), rel=1e-6)  # uniform logits: -log(1/4)
    g = logits.grad  # (softmax - target) / B: pulls each row toward its edge bin
    assert torch.isfinite(g).all() and float(g.abs().sum()) > 0
    assert float(g[0, 0]) == pytest.approx((0.25 - 1) / 2, abs=1e-3)
    assert float(g[1, 3]) == pytest.approx((0.25 - 1) / 2, abs=1e-3)


def test_hl_gauss_inside_the_support_is_the_erf_form():
    # the log-space form agrees with the plain one where that one is accurate
    y = torch.linspace(-1.5, 2.5, 81, dtype=torch.float64)
    for sigma in (0.3, 0.75):
        want = torch.tensor([[phi((e1 - t) / sigma) - phi((e0 - t) / sigma)
                              for e0, e1 in zip([-1.5, -0.5, 0.5, 1.5], [-0.5, 0.5, 1.5, 2.5])]
                             for t in y.tolist()], dtype=torch.float64)
        want = want / want.sum(1, keepdim=True)
        assert torch.allclose(vt.hl_gauss(y, Z, sigma), want, rtol=1e-9, atol=1e-13)
    with pytest.raises(ValueError, match="finite"):
        vt.hl_gauss(torch.tensor([float("nan")]), Z, 0.5)
