"""Reward shaping and reward distances (EPIC, DARD, STARC, L2): hand-computed canonicalisations, the
invariances (shaping, positive scale, S'-redistribution), metric axioms, the regret bound, and
BARFI's first-order meta-gradient against its closed form on a softmax bandit."""

import itertools
import math

import numpy as np
import pytest
import torch

from agentrl_lib.algorithms import dp
from agentrl_lib.envs import tabular as T
from agentrl_lib.rewards import distances as D
from agentrl_lib.rewards import shaping as sh

F = torch.float64


def two_state():
    """S = 2, A = 2, deterministic: action 0 goes to state 0, action 1 to state 1.
    R on possible transitions: (0,0,0) 1, (0,1,1) 0, (1,0,0) 0, (1,1,1) 2; impossible ones 5."""
    P = torch.zeros(2, 2, 2, dtype=F)
    P[:, 0, 0] = 1.0
    P[:, 1, 1] = 1.0
    R = torch.full((2, 2, 2), 5.0, dtype=F)
    R[0, 0, 0], R[0, 1, 1], R[1, 0, 0], R[1, 1, 1] = 1.0, 0.0, 0.0, 2.0
    return R, P


def random_problem(seed, S=6, A=3, gamma=0.9, alpha=0.3):
    m = T.random_mdp(S, A, gamma=gamma, seed=seed, alpha=alpha)
    rng = np.random.default_rng(100 + seed)
    R = torch.as_tensor(rng.normal(size=(S, A, S)), dtype=F)
    return m, R, rng


def test_pbrs_by_hand_and_expected_form():
    R = torch.zeros(2, 1, 2, dtype=F)
    out = sh.pbrs(R, torch.tensor([1.0, 0.0]), gamma=0.5)
    # R'(s, a, s') = 0.5 phi(s') - phi(s): (0 -> 0) -0.5, (0 -> 1) -1, (1 -> 0) 0.5, (1 -> 1) 0
    assert torch.allclose(out[:, 0], torch.tensor([[-0.5, -1.0], [0.5, 0.0]], dtype=F))
    m, R3, rng = random_problem(0)
    phi = torch.as_tensor(rng.normal(size=6), dtype=F)
    full = sh.expected_reward(sh.pbrs(R3, phi, 0.9), m.P)
    assert torch.allclose(full, sh.pbrs(sh.expected_reward(R3, m.P), phi, 0.9, P=m.P))
    term = torch.tensor([False, True])
    assert torch.allclose(sh.pbrs(R, torch.tensor([1.0, 3.0]), 0.5, terminal=term),
                          sh.pbrs(R, torch.tensor([1.0, 0.0]), 0.5))
    with pytest.raises(ValueError, match="needs the transitions P"):
        sh.pbrs(torch.zeros(2, 2), torch.zeros(2), 0.9)
    with pytest.raises(ValueError, match="disagree"):
        sh.pbrs(torch.zeros(3, 2, 3), torch.zeros(2), 0.9)


def test_pbrs_keeps_optimal_policy_and_shifts_returns():
    m, R, rng = random_problem(1)
    phi = torch.as_tensor(rng.normal(size=6) * 5, dtype=F)
    m1 = T.TabularMDP(m.P, sh.expected_reward(R, m.P), m.gamma, m.init, m.terminal)
    m2 = T.TabularMDP(m.P, sh.expected_reward(sh.pbrs(R, phi, m.gamma), m.P), m.gamma, m.init, m.terminal)
    _, pi1, _, _ = dp.value_iteration(m1, tol=1e-12)
    _, pi2, _, _ = dp.value_iteration(m2, tol=1e-12)
    assert torch.equal(pi1, pi2)
    pi = torch.softmax(torch.as_tensor(rng.normal(size=(6, 3)), dtype=F), -1)
    # J'(pi) = J(pi) - E_{s0}[phi(s0)] for every policy
    assert math.isclose(dp.expected_return(m2, pi).item(),
                        dp.expected_return(m1, pi).item() - (m.init @ phi).item(), abs_tol=1e-9)


def test_epic_canonicalisation_by_hand():
    R, _ = two_state()
    C = D.epic_canonicalize(R, gamma=0.5)
    # m(0) = (1 + 5 + 5 + 0) / 4 = 2.75, m(1) = (0 + 5 + 5 + 2) / 4 = 3, E m = 2.875
    # C(0, 0, 0) = 1 + 0.5 * 2.75 - 2.75 - 0.5 * 2.875 = -1.8125
    assert math.isclose(C[0, 0, 0].item(), -1.8125)
    # C(1, 1, 1) = 2 + 0.5 * 3 - 3 - 1.4375 = -0.9375
    assert math.isclose(C[1, 1, 1].item(), -0.9375)
    # an independent loop over the definition
    for s, a, t in itertools.product(range(2), repeat=3):
        ER = lambda x: np.mean([R[x, b, u].item() for b in range(2) for u in range(2)])
        want = R[s, a, t].item() + 0.5 * ER(t) - ER(s) - 0.5 * np.mean([ER(x) for x in range(2)])
        assert math.isclose(C[s, a, t].item(), want, abs_tol=1e-12)
    assert abs(C.mean().item()) < 1e-12  # zero mean under uniform distributions


def test_val_canonicalisation_by_hand():
    R, P = two_state()
    C = D.val_canonicalize(R, P, gamma=0.5)
    # uniform pi: V0 = 0.5 + 0.25 V0 + 0.25 V1, V1 = 1 + 0.25 V0 + 0.25 V1 -> V = (1.25, 1.75)
    q, v = D.policy_values(R, P, 0.5)
    assert torch.allclose(v, torch.tensor([1.25, 1.75], dtype=F))
    # advantages: Q(0,0) = 1 + 0.5 V0 = 1.625 -> 0.375; Q(0,1) = 0.5 V1 = 0.875 -> -0.375;
    # Q(1,0) = 0.5 V0 = 0.625 -> -1.125; Q(1,1) = 2 + 0.875 -> 1.125; the same for every s'
    adv = torch.tensor([[0.375, -0.375], [-1.125, 1.125]], dtype=F)
    assert torch.allclose(C, adv[:, :, None].expand(2, 2, 2))
    # VAL ignores rewards on impossible transitions; EPIC does not
    R2 = R.clone()
    R2[0, 0, 1] = -7.0  # P(1 | 0, 0) = 0
    assert torch.allclose(D.val_canonicalize(R2, P, 0.5), C)
    assert not torch.allclose(D.epic_canonicalize(R2, 0.5), D.epic_canonicalize(R, 0.5))


def test_dard_canonicalisation_by_hand():
    R, P = two_state()
    C = D.dard_canonicalize(R, P, gamma=0.5)
    # m(x) = E_A R(x, A, T(x, A)): m(0) = (1 + 0) / 2 = 0.5, m(1) = (0 + 2) / 2 = 1; the last term
    # E_A R(T(s, A), A, T(s', A)) = (R(0,0,0) + R(1,1,1)) / 2 = 1.5 for every (s, s')
    # C(0,0,0) = 1 + 0.5 * 0.5 - 0.5 - 0.5 * 1.5 = 0; C(1,1,1) = 2 + 0.5 - 1 - 0.75 = 0.75;
    # C(0,0,1) = 5 + 0.5 - 0.5 - 0.75 = 4.25 (an impossible transition keeps its 5)
    assert math.isclose(C[0, 0, 0].item(), 0.0, abs_tol=1e-12)
    assert math.isclose(C[1, 1, 1].item(), 0.75)
    assert math.isclose(C[0, 0, 1].item(), 4.25)


@pytest.mark.parametrize("seed", [0, 1])
def test_dard_matches_a_loop_over_its_definition(seed):
    m, R, rng = random_problem(seed, S=4, A=2)
    P, g = m.P.numpy(), m.gamma
    Rn = R.numpy()
    S, A, _ = Rn.shape
    C = D.dard_canonicalize(R, m.P, g).numpy()
    for s, a, t in itertools.product(range(S), range(A), range(S)):
        want = Rn[s, a, t]
        for b in range(A):  # A ~ uniform, then S' ~ T(s, b), S'' ~ T(t, b)
            for x, y in itertools.product(range(S), repeat=2):
                w = P[s, b, x] * P[t, b, y] / A
                want += w * (g * Rn[t, b, y] - Rn[s, b, x] - g * Rn[x, b, y])
        assert math.isclose(C[s, a, t], want, abs_tol=1e-10)
    # shaping is removed exactly; S'-redistribution is not (its last term reads S'' ~ T(s', A))
    phi = torch.as_tensor(rng.normal(size=S) * 10, dtype=F)
    assert torch.allclose(D.dard_canonicalize(sh.pbrs(R, phi, g), m.P, g),
                          D.dard_canonicalize(R, m.P, g), atol=1e-9)
    assert D.dard_distance(R, sh.rescale(sh.pbrs(R, phi, g), 3.0), m.P, g)[0] < 1e-6
    assert D.starc_distance(R, sh.pbrs(R, phi, g), g, m.P, "dard")[0] < 1e-7
    red = sh.redistribute(R, m.P, 1.0, rng)
    assert D.starc_distance(R, red, g, m.P, "dard")[0] > 0.05
    assert D.starc_distance(R, red, g, m.P, "val")[0] < 1e-7
    with pytest.raises(ValueError, match="needs the transitions P"):
        D.canonicalize(R, g, "dard")


@pytest.mark.parametrize("seed", [0, 1])
def test_invariances(seed):
    m, R, rng = random_problem(seed)
    g = m.gamma
    phi = torch.as_tensor(rng.normal(size=6) * 10, dtype=F)
    shaped = sh.pbrs(R, phi, g)
    scaled = sh.rescale(sh.pbrs(R, phi, g), 7.5)
    for R2 in (shaped, scaled, sh.rescale(R, 0.01)):
        assert D.epic_distance(R, R2, g)[0] < 1e-6
        assert D.starc_distance(R, R2, g, m.P, "epic")[0] < 1e-7
        assert D.starc_distance(R, R2, g, m.P, "val")[0] < 1e-7
        assert D.starc_distance(R, R2, g, m.P, "val", norm="l1")[0] < 1e-7
        assert D.l2_distance(R, R2)[0] > 0.1
    # S'-redistribution: same expected reward, so same returns: STARC-VAL 0, EPIC not
    red = sh.redistribute(R, m.P, 1.0, rng)
    assert torch.allclose(sh.expected_reward(red, m.P), sh.expected_reward(R, m.P))
    assert D.starc_distance(R, red, g, m.P, "val")[0] < 1e-7
    assert D.epic_distance(R, red, g)[0] > 0.1
    # a negative scale reverses every preference: the largest distance, 1
    assert math.isclose(D.starc_distance(R, -R, g, m.P, "val")[0], 1.0, abs_tol=1e-9)
    assert math.isclose(D.epic_distance(R, -2 * R, g)[0], 1.0, abs_tol=1e-6)


def test_epic_equals_starc_with_epic_canonicalisation():
    m, R, rng = random_problem(3)
    R2 = sh.add_noise(R, 0.8, rng)
    d_epic, met = D.epic_distance(R, R2, m.gamma)
    d_starc, _ = D.starc_distance(R, R2, m.gamma, canonicalization="epic")
    assert math.isclose(d_epic, d_starc, abs_tol=1e-9)
    # rho from an independent Pearson (numpy) on the canonical rewards
    c1, c2 = D.epic_canonicalize(R, m.gamma), D.epic_canonicalize(R2, m.gamma)
    rho = np.corrcoef(c1.flatten().numpy(), c2.flatten().numpy())[0, 1]
    assert math.isclose(met["rho"], rho, abs_tol=1e-9)


@pytest.mark.parametrize("kind", ["epic_distance", "starc_val", "starc_epic"])
def test_symmetry_and_triangle_inequality(kind):
    m, R, rng = random_problem(4)
    rewards = [R] + [sh.add_noise(R, s, rng) for s in (0.3, 1.0, 3.0)] + \
              [torch.as_tensor(rng.normal(size=R.shape), dtype=F) for _ in range(3)]

    def d(a, b):
        if kind == "epic_distance":
            return D.epic_distance(a, b, m.gamma)[0]
        return D.starc_distance(a, b, m.gamma, m.P, kind.split("_")[1])[0]

    M = np.array([[d(a, b) for b in rewards] for a in rewards])
    assert np.allclose(M, M.T, atol=1e-12)
    assert np.allclose(np.diag(M), 0.0, atol=1e-7) and M.max() <= 1.0 + 1e-12
    for i, j, k in itertools.product(range(len(rewards)), repeat=3):
        assert M[i, k] <= M[i, j] + M[j, k] + 1e-12
    assert M[0, 1] < M[0, 3]  # more noise, farther away


def occupancy(mdp, pi):
    """Discounted state-action occupancy d(s, a) = sum_t gamma^t Pr(s_t = s, a_t = a). (S, A)"""
    P_pi = torch.einsum("sa,sat->st", pi, mdp.P)
    d_s = torch.linalg.solve(torch.eye(mdp.num_states, dtype=F) - mdp.gamma * P_pi.T, mdp.init)
    return d_s[:, None] * pi


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_regret_bound(seed):
    """regret = J1(pi1*) - J1(pi2*) <= 2 ||c(R1)||_2 ||d^{pi1*} - d^{pi2*}||_2 d_STARC(R1, R2),
    with d the transition occupancy d(s, a) P(s'|s, a): J_R(pi) = <d, R> + const under c."""
    m, R1, rng = random_problem(seed)
    for sigma in (0.1, 0.5, 2.0):
        R2 = sh.pbrs(sh.add_noise(R1, sigma, rng), torch.as_tensor(rng.normal(size=6), dtype=F), m.gamma)
        mdps = [T.TabularMDP(m.P, sh.expected_reward(r, m.P), m.gamma, m.init, m.terminal) for r in (R1, R2)]
        pis = [dp.value_iteration(x, tol=1e-12)[1] for x in mdps]
        regret = (dp.expected_return(mdps[0], pis[0]) - dp.expected_return(mdps[0], pis[1])).item()
        assert regret >= -1e-9
        dd = (occupancy(m, pis[0]) - occupancy(m, pis[1]))[:, :, None] * m.P  # (S, A, S)
        for canon in ("val", "epic"):
            c1 = D.canonicalize(R1, m.gamma, canon, m.P)
            # the canonical reward ranks policies as R1 does: same return differences
            assert math.isclose((dd * c1).sum().item(), regret, abs_tol=1e-8)
            dist = D.starc_distance(R1, R2, m.gamma, m.P, canon)[0]
            bound = 2 * c1.norm().item() * dd.norm().item() * dist
            assert regret <= bound + 1e-9
            # and the worst case over policies: ||d1 - d2||_2 <= 2 / (1 - gamma)
            assert regret <= 2 * c1.norm().item() * 2 / (1 - m.gamma) * dist + 1e-9


def test_proxies_and_bad_input():
    m, R, rng = random_problem(5)
    pi_star = dp.value_iteration(T.TabularMDP(m.P, sh.expected_reward(R, m.P), m.gamma, m.init,
                                              m.terminal))[1]
    R2 = sh.adversarial_edit(R, pi_star, 0.5, 3, np.random.default_rng(0))
    diff = (R2 - R).abs().sum((1, 2))  # (S,) edited states change by 2 * delta * S entries
    assert (diff > 0).sum() == 3 and torch.allclose(diff[diff > 0], torch.tensor(0.5 * 2 * 6, dtype=F))
    assert math.isclose((R2 - R).sum().item(), 0.0, abs_tol=1e-12)
    with pytest.raises(ValueError, match="unknown canonicalization 'foo'"):
        D.starc_distance(R, R, 0.9, m.P, "foo")
    with pytest.raises(ValueError, match="needs the transitions P"):
        D.starc_distance(R, R, 0.9, None, "val")
    with pytest.raises(ValueError, match=r"\(S, A, S\)"):
        D.epic_distance(torch.zeros(3, 2), torch.zeros(3, 2), 0.9)
    with pytest.raises(ValueError, match="unknown norm"):
        D.normalize(R, "linf")
    with pytest.raises(ValueError, match="constant"):
        D.pearson_distance(torch.ones(4), torch.arange(4.0))
    assert D.starc_distance(torch.zeros_like(R), R, 0.9, m.P)[0] == pytest.approx(0.5)  # 0 vs unit


class ScriptedRng:
    """Stands in for numpy's generator: ``normal`` and ``random`` return scripted values in turn."""

    def __init__(self, normals, uniforms):
        self.normals, self.uniforms = list(normals), list(uniforms)

    def normal(self, size):
        out = np.asarray(self.normals.pop(0), dtype=float)
        assert out.shape == tuple(np.atleast_1d(size)), (out.shape, size)
        return out

    def random(self):
        return self.uniforms.pop(0)


def test_random_reward_by_hand():
    # S = 2, A = 1, gamma = 1/2. R0 = [[3.5, 0.2], [-1, 4]] (s, s'); draws: 0.9 > 0.8 -> sparse
    # (keep > 3): [[3.5, 0], [0, 4]]; 0.5 > 0.3 -> scale by 10 * 0.2 = 2: [[7, 0], [0, 8]];
    # 0.8 > 0.7 -> shift by 10 * 0.1 = 1: [[8, 1], [1, 9]]; 0.6 > 0.5 -> shaped with
    # phi = [1, -1] * 10 * 0.5 + 0.5 = [5.5, -4.5]: R + phi(s') / 2 - phi(s) is
    # (0,0) 8 + 2.75 - 5.5 = 5.25, (0,1) 1 - 2.25 - 5.5 = -6.75, (1,0) 1 + 2.75 + 4.5 = 8.25,
    # (1,1) 9 - 2.25 + 4.5 = 11.25
    rng = ScriptedRng([[[[3.5, 0.2]], [[-1.0, 4.0]]], [1.0, -1.0]],
                      [0.9, 0.5, 0.2, 0.8, 0.1, 0.6, 0.5, 0.5])
    R = sh.random_reward(2, 1, 0.5, rng)
    want = torch.tensor([[5.25, -6.75], [8.25, 11.25]], dtype=F)
    assert torch.allclose(R[:, 0, :], want)
    assert not rng.uniforms and not rng.normals  # every draw used, in that order
    # coins that come up "no": R0 unchanged; flags given: no coin drawn for them
    rng = ScriptedRng([[[[3.5, 0.2]], [[-1.0, 4.0]]]], [0.7, 0.1, 0.3, 0.2, 0.9])
    R = sh.random_reward(2, 1, 0.5, rng)
    assert torch.allclose(R[:, 0, :], torch.tensor([[3.5, 0.2], [-1.0, 4.0]], dtype=F))
    assert rng.uniforms == [0.9]  # four coins (sparse, scale, shift, shaped), nothing else
    R = sh.random_reward(2, 1, 0.5, ScriptedRng([[[[3.5, 0.2]], [[-1.0, 4.0]]]], [0.1, 0.1]),
                         sparse=True, shaped=False)
    assert torch.allclose(R[:, 0, :], torch.tensor([[3.5, 0.0], [0.0, 4.0]], dtype=F))
    assert [sh.sparse_reward_threshold(n) for n in (32, 64, 128)] == [3.0, 3.5, 3.8]


def test_interpolate_by_hand():
    R1, R2 = torch.zeros(2, 1, 2, dtype=F), torch.full((2, 1, 2), 16.0, dtype=F)
    out = sh.interpolate(R1, R2, 16)
    assert out.shape == (16, 2, 1, 2)
    assert [out[k, 0, 0, 0].item() for k in range(16)] == [float(k) for k in range(1, 17)]
    R1 = torch.tensor([[[1.0, -2.0]]], dtype=F)
    R2 = torch.tensor([[[3.0, 2.0]]], dtype=F)
    assert torch.allclose(sh.interpolate(R1, R2, 4)[0], torch.tensor([[[1.5, -1.0]]], dtype=F))
    assert torch.allclose(sh.interpolate(R1, R2, 4)[-1], R2)
    with pytest.raises(ValueError, match="differ in shape"):
        sh.interpolate(R1, torch.zeros(2, 1, 2), 4)


def test_canonicalisations_are_linear_so_interpolation_commutes():
    """The notebook canonicalises the two ends of a segment and interpolates: exact, since every
    canonicalisation is linear in R."""
    m, R1, rng = random_problem(3)
    R2 = sh.random_reward(6, 3, m.gamma, rng)
    Ri = sh.interpolate(R1, R2, 4)[1]  # t = 1/2
    for c in ("val", "epic", "dard"):
        c1, c2 = (D.canonicalize(R, m.gamma, c, m.P) for R in (R1, R2))
        assert torch.allclose(D.canonicalize(Ri, m.gamma, c, m.P), 0.5 * (c1 + c2), atol=1e-9)


def _softmax_pg(theta, r):
    """grad_theta of pi . r for pi = softmax(theta), by hand: pi * (r - pi . r)."""
    pi = torch.softmax(theta, -1)
    return pi * (r - (pi * r).sum())


def test_first_order_meta_grad_by_hand_on_a_bandit():
    # J_phi(theta) = pi . (r + w h), J_p(theta) = pi . r: grad_theta J_phi is linear in w, so
    # g_w = grad_theta(pi . h) . grad_theta(pi . r), each a softmax gradient written out by hand
    r = torch.tensor([1.0, 0.0, 0.3], dtype=F)
    h = torch.tensor([-0.5, 2.0, 0.1], dtype=F)
    theta = torch.tensor([0.2, -0.4, 0.9], dtype=F, requires_grad=True)
    w = torch.tensor(0.7, dtype=F, requires_grad=True)
    pi = torch.softmax(theta, -1)
    inner, = torch.autograd.grad((pi * (r + w * h)).sum(), theta, create_graph=True)
    outer = _softmax_pg(theta.detach(), r)
    g, = sh.first_order_meta_grad(inner, outer, w)
    by_hand = (_softmax_pg(theta.detach(), h) * outer).sum()
    assert math.isclose(g.item(), by_hand.item(), rel_tol=1e-12)
    # the one-step lookahead d J_p(theta + a grad J_phi) / dw, divided by a, tends to g
    a = 1e-6
    th1 = theta.detach() + a * _softmax_pg(theta.detach(), r + w * h)
    look, = torch.autograd.grad((torch.softmax(th1, -1) * r).sum(), w)
    assert math.isclose(look.item() / a, by_hand.item(), rel_tol=1e-4)
    assert abs(by_hand.item()) > 1e-3  # not a vacuous agreement at 0


def test_first_order_meta_grad_discount_penalty_and_bad_input():
    # a learned "discount" psi scaling the inner gradient: inner = sigmoid(psi) * theta,
    # outer = c, so d/dpsi[sigmoid(psi) theta . c] = s (1 - s) theta . c; the penalty
    # k * sigmoid(psi) (the code's gamma_L2 term) subtracts k s (1 - s)
    psi = torch.tensor(0.4, dtype=F, requires_grad=True)
    theta = torch.tensor([1.0, -2.0], dtype=F)
    c = torch.tensor([0.5, 0.1], dtype=F)  # theta . c = 0.3
    s = torch.sigmoid(psi)
    unused = torch.tensor([3.0], dtype=F, requires_grad=True)
    g_psi, g_unused = sh.first_order_meta_grad([s * theta], [c], [psi, unused], penalty=2.0 * s)
    sv = 1 / (1 + math.exp(-0.4))
    assert math.isclose(g_psi.item(), sv * (1 - sv) * 0.3 - 2.0 * sv * (1 - sv),
                        rel_tol=1e-12)
    assert torch.equal(g_unused, torch.zeros(1, dtype=F))
    with pytest.raises(ValueError, match="same parameters"):
        sh.first_order_meta_grad([s * theta], [c, c], psi)
    with pytest.raises(ValueError, match="same parameters"):
        sh.first_order_meta_grad(s * theta, c[:1], psi)
