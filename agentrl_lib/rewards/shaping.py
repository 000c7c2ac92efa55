"""Potential-based reward shaping (PBRS) of tabular rewards, and the proxy rewards that the
reward-distance notebooks compare against a true reward.

A tabular reward is a tensor R (S, A, S) over transitions (s, a, s'), or its expectation
R (S, A) = sum_s' P(s'|s, a) R(s, a, s'). Shaping with a potential phi (S,) (Ng, Harada and
Russell 1999):

    R'(s, a, s') = R(s, a, s') + gamma * phi(s') - phi(s)

changes every policy's return by the same constant -E_{s0}[phi(s0)] (infinite horizon, or
phi = 0 at absorbing terminal states), so it keeps the ordering of policies and the optimal
policies. With R (S, A) and P (S, A, S) the expected shaped reward is
R(s, a) + gamma * sum_s' P(s'|s, a) phi(s') - phi(s).

``first_order_meta_grad`` is BARFI's outer gradient for a learned reward (Gupta et al. 2023,
notebook 22): the first-order implicit gradient of the primary return through the inner loop.

The proxy builders (``rescale``, ``add_noise``, ``redistribute``, ``adversarial_edit``) make the
rewards whose distance to the truth the STARC notebook (21) compares with the regret of
optimising them; ``random_reward`` and ``interpolate`` are the STARC authors' experiment (random
reward pairs and the rewards on the segment between them). Pure functions of arrays: this module
imports nothing from envs or models.
"""

from __future__ import annotations

import numpy as np
import torch

Tensor = torch.Tensor
DTYPE = torch.float64


def _t(x) -> Tensor:
    return torch.as_tensor(x, dtype=DTYPE)


def pbrs(R, phi, gamma: float, P=None, terminal=None) -> Tensor:
    """Potential-based shaping R + gamma * phi(s') - phi(s).

    R: (S, A, S) transition reward, or (S, A) expected reward (then P (S, A, S) is required and
    the result is the expected shaped reward). phi: (S,). terminal: optional (S,) bool; phi is
    taken as 0 at terminal states (absorbing, value 0), so the optimal policies are kept in
    episodic MDPs. Returns a tensor of R's shape.

    >>> pbrs(torch.zeros(2, 1, 2), torch.tensor([1.0, 0.0]), gamma=0.5)[:, 0]
    tensor([[-0.5000, -1.0000],
            [ 0.5000,  0.0000]], dtype=torch.float64)
    """
    R, phi = _t(R), _t(phi)
    if terminal is not None:
        phi = phi * (~torch.as_tensor(terminal, dtype=torch.bool)).to(DTYPE)
    S = phi.shape[0]
    if R.dim() == 3:
        if R.shape[0] != S or R.shape[2] != S:
            raise ValueError(f"R {tuple(R.shape)} and phi {tuple(phi.shape)} disagree on S")
        return R + gamma * phi[None, None, :] - phi[:, None, None]  # (S, A, S)
    if R.dim() == 2:
        if P is None:
            raise ValueError("shaping an expected reward R (S, A) needs the transitions P (S, A, S)")
        P = _t(P)
        if P.shape != (S, R.shape[1], S) or R.shape[0] != S:
            raise ValueError(f"shapes disagree: R {tuple(R.shape)}, P {tuple(P.shape)}, phi ({S},)")
        return R + gamma * torch.einsum("sat,t->sa", P, phi) - phi[:, None]  # (S, A)
    raise ValueError(f"R must be (S, A, S) or (S, A), got shape {tuple(R.shape)}")


def first_order_meta_grad(inner_grads, outer_grads, params, penalty=None) -> tuple[Tensor, ...]:
    """BARFI's first-order meta-gradient (the released code's ``Barfi.py::outer_first_order``):
    the implicit gradient of the primary return J_p through the inner loop's solution, with the
    inner Hessian taken as -I,

        g = d/dphi [ grad_theta J_phi(theta) . grad_theta J_p(theta) ] - d penalty / dphi,

    an ascent direction for the outer parameters phi (the code stores -g as ``.grad`` and lets a
    minimising optimizer step). It is the one-step lookahead d J_p(theta + a grad J_phi)/d phi
    divided by the step a, as a -> 0.

    inner_grads: grad_theta J_phi (a tensor or a list of them), built with ``create_graph=True``
    so that it depends on ``params``; outer_grads: grad_theta J_p, same shapes, taken as constants;
    params: the outer parameters (a tensor or a list); penalty: an optional scalar subtracted
    before differentiating (the code's ``reward_L2`` and ``gamma_L2 * gamma_phi`` terms). Returns
    one tensor per parameter (zeros where a parameter does not enter).

    >>> phi = torch.tensor([2.0, -1.0], requires_grad=True)
    >>> theta = torch.tensor([0.5, 1.5])
    >>> inner = phi * theta  # grad_theta of J_phi = sum(phi * theta^2 / 2)
    >>> first_order_meta_grad(inner, 2 * theta, phi)[0]  # J_p = |theta|^2: d/dphi(phi.theta^2*2)
    tensor([0.5000, 4.5000])
    """
    inner = [inner_grads] if isinstance(inner_grads, Tensor) else list(inner_grads)
    outer = [outer_grads] if isinstance(outer_grads, Tensor) else list(outer_grads)
    params = [params] if isinstance(params, Tensor) else list(params)
    if len(inner) != len(outer) or any(a.shape != b.shape for a, b in zip(inner, outer)):
        raise ValueError("inner_grads and outer_grads must be gradients of the same parameters")
    dot = sum((gi * go.detach()).sum() for gi, go in zip(inner, outer))
    if penalty is not None:
        dot = dot - penalty
    grads = torch.autograd.grad(dot, params, allow_unused=True)
    return tuple(torch.zeros_like(p) if g is None else g for p, g in zip(params, grads))


def expected_reward(R, P) -> Tensor:
    """R(s, a) = sum_s' P(s'|s, a) R(s, a, s'). (S, A, S) x (S, A, S) -> (S, A)"""
    return (_t(P) * _t(R)).sum(-1)


def broadcast_reward(R_sa, num_states: int | None = None) -> Tensor:
    """An (S, A) reward as a transition reward R(s, a, s') = R(s, a) for every s'. (S, A, S)"""
    R_sa = _t(R_sa)
    S = R_sa.shape[0] if num_states is None else num_states
    return R_sa[:, :, None].expand(R_sa.shape[0], R_sa.shape[1], S).clone()


def rescale(R, scale: float) -> Tensor:
    """scale * R. A positive scale keeps the ordering of policies; a negative one reverses it."""
    return float(scale) * _t(R)


def add_noise(R, sigma: float, rng: np.random.Generator) -> Tensor:
    """R + sigma * N(0, 1) on every entry (the noise is drawn with numpy's ``rng``)."""
    R = _t(R)
    return R + sigma * torch.as_tensor(rng.normal(size=tuple(R.shape)), dtype=DTYPE)


def redistribute(R, P, sigma: float, rng: np.random.Generator) -> Tensor:
    """An S'-redistribution of R (S, A, S): add noise e(s, a, s') with sum_s' P(s'|s, a) e = 0,
    so the expected reward R(s, a), hence every policy's return, is unchanged. Entries at
    impossible transitions (P = 0) get noise freely; those at possible ones are centred under P.
    """
    R, P = _t(R), _t(P)
    e = sigma * torch.as_tensor(rng.normal(size=tuple(R.shape)), dtype=DTYPE)  # (S, A, S)
    e = e - (P * e).sum(-1, keepdim=True)  # E_P[e] = 0 since sum_s' P = 1
    return R + e


def adversarial_edit(R, pi_star, delta: float, num_states: int, rng: np.random.Generator) -> Tensor:
    """Edit R (S, A, S) against a policy: in ``num_states`` states drawn by ``rng``, lower the
    reward of the action pi_star takes by ``delta`` and raise one other (random) action's by
    ``delta``. A small L2 change aimed at flipping the optimal action where it is cheapest.

    pi_star: (S, A) one-hot (or (S,) action indices).
    """
    R = _t(R).clone()
    S, A = R.shape[0], R.shape[1]
    if A < 2:
        raise ValueError("an adversarial edit needs at least 2 actions")
    pi_star = torch.as_tensor(pi_star)
    best = pi_star.argmax(-1) if pi_star.dim() == 2 else pi_star.long()  # (S,)
    for s in rng.choice(S, size=min(num_states, S), replace=False):
        a = int(best[s])
        b = int(rng.choice([x for x in range(A) if x != a]))
        R[s, a] -= delta
        R[s, b] += delta
    return R


def sparse_reward_threshold(num_states: int) -> float:
    """The sparsity threshold of ``random_reward``: 3 below 50 states, 3.5 below 100, else 3.8
    (the STARC authors' rule: a few entries of N(0, 1) pass it)."""
    return 3.0 if num_states < 50 else (3.5 if num_states < 100 else 3.8)


def random_reward(num_states: int, num_actions: int, gamma: float, rng,
                  sparse: bool | None = None, shaped: bool | None = None) -> Tensor:
    """A random transition reward (S, A, S) as the STARC authors draw it (lucyfarnik/starc @
    e13f8fa, ``src/env/reward.py::random_reward`` with ``state_dependent=False``,
    ``reward_only_in_terminal=False``), with numpy's ``rng`` for its ``np.random``:

    1. R ~ iid N(0, 1);
    2. sparse (``sparse`` True, or None and a uniform draw > 0.8): entries at or below
       ``sparse_reward_threshold`` become 0;
    3. with probability 0.7 (a draw > 0.3) R *= 10 U, U ~ U(0, 1);
    4. with probability 0.3 (a draw > 0.7) R += 10 U;
    5. shaped (``shaped`` True, or None and a draw > 0.5): R + gamma phi(s') - phi(s) with
       phi = N(0, I) * 10 U + U' (``potential_shaping``).

    The draws come in that order (a step whose flag is given draws nothing for its coin)."""
    S, A = num_states, num_actions
    r = rng.normal(size=(S, A, S))
    if sparse is True or (sparse is None and rng.random() > 0.8):
        r = np.where(r > sparse_reward_threshold(S), r, 0.0)
    if rng.random() > 0.3:
        r = r * (10 * rng.random())
    if rng.random() > 0.7:
        r = r + 10 * rng.random()
    if shaped is True or (shaped is None and rng.random() > 0.5):
        phi = rng.normal(size=S)
        phi = phi * (10 * rng.random())
        phi = phi + rng.random()
        r = r + gamma * phi[None, None, :] - phi[:, None, None]
    return _t(r)


def interpolate(R1, R2, steps: int) -> Tensor:
    """The rewards R1 + (k / steps) (R2 - R1) for k = 1, ..., steps (the last is R2), stacked:
    (steps, *R1.shape). The STARC authors' ``interpolate`` (linear, not logarithmic)."""
    R1, R2 = _t(R1), _t(R2)
    if R1.shape != R2.shape:
        raise ValueError(f"R1 {tuple(R1.shape)} and R2 {tuple(R2.shape)} differ in shape")
    t = torch.arange(1, steps + 1, dtype=DTYPE) / steps
    return R1[None] + t.reshape(-1, *([1] * R1.dim())) * (R2 - R1)[None]
