"""Exact dynamic programming on a ``TabularMDP``: policy evaluation, Q and advantages, value and
policy iteration, and the finite-horizon advantages of a policy cut after H turns.

``visit_distribution`` and ``softmax_entropy_grad`` give the exact expectation of an entropy
bonus averaged over an episode's visited steps (BARFI's inner loop, notebook 22).

These are the oracles every tabular check leans on. All are differentiable in the policy, so
``expected_return(mdp, pi)`` gives the exact policy gradient through autograd.

Shapes: S states, A actions, H turns. P: (S, A, S); R: (S, A); a policy pi: (S, A).
Sutton & Barto (2018), ch. 3-4, for the Bellman equations used here.
"""

from __future__ import annotations

import torch

from agentrl_lib.envs.tabular import DTYPE, TabularMDP

Tensor = torch.Tensor


def uniform_policy(mdp: TabularMDP) -> Tensor:
    """pi(a|s) = 1/A for every state. (S, A)"""
    return torch.full((mdp.num_states, mdp.num_actions), 1.0 / mdp.num_actions, dtype=DTYPE,
                      device=mdp.P.device)


def _continuing(mdp: TabularMDP) -> Tensor:
    """P with the outgoing rows of terminal states zeroed: V(terminal) = 0. (S, A, S)"""
    return mdp.P * (~mdp.terminal).to(DTYPE)[:, None, None]


def policy_evaluation(mdp: TabularMDP, pi: Tensor) -> Tensor:
    """V^pi by solving (I - gamma P_pi) V = r_pi; differentiable in pi. pi: (S, A) -> V: (S,).

    With gamma = 1 the policy must reach a terminal state with probability 1 (else singular).
    """
    pi = pi.to(DTYPE)
    live = (~mdp.terminal).to(DTYPE)
    P_pi = torch.einsum("sa,sat->st", pi, _continuing(mdp))  # (S, S)
    r_pi = (pi * mdp.R).sum(-1) * live  # (S,)
    eye = torch.eye(mdp.num_states, dtype=DTYPE, device=mdp.P.device)
    return torch.linalg.solve(eye - mdp.gamma * P_pi, r_pi)


def q_from_v(mdp: TabularMDP, v: Tensor) -> Tensor:
    """Q(s, a) = R(s, a) + gamma * sum_s' P(s'|s, a) V(s'); 0 at terminal states. (S, A)"""
    live = (~mdp.terminal).to(DTYPE)[:, None]
    return (mdp.R + mdp.gamma * torch.einsum("sat,t->sa", mdp.P, v)) * live


def q_values(mdp: TabularMDP, pi: Tensor) -> Tensor:
    """Q^pi (S, A)."""
    return q_from_v(mdp, policy_evaluation(mdp, pi))


def advantages(mdp: TabularMDP, pi: Tensor) -> Tensor:
    """A^pi(s, a) = Q^pi(s, a) - V^pi(s). (S, A)"""
    v = policy_evaluation(mdp, pi)
    return q_from_v(mdp, v) - v[:, None]


def expected_return(mdp: TabularMDP, pi: Tensor) -> Tensor:
    """J(pi) = sum_s init(s) V^pi(s): the exact objective, a differentiable scalar."""
    return mdp.init @ policy_evaluation(mdp, pi)


def visit_distribution(mdp: TabularMDP, pi: Tensor) -> Tensor:
    """rho(s) = E[steps taken in s before a terminal state] / E[steps taken]: the share of an
    episode's steps spent in s, undiscounted (each step counts once, as in a mean over the
    visited steps of sampled episodes). pi must reach a terminal state with probability 1.
    Differentiable in pi. pi: (S, A) -> (S,), 0 at terminal states, summing to 1.
    """
    pi = pi.to(DTYPE)
    live = (~mdp.terminal).to(DTYPE)
    P_pi = torch.einsum("sa,sat->st", pi, _continuing(mdp))  # (S, S)
    eye = torch.eye(mdp.num_states, dtype=DTYPE, device=mdp.P.device)
    n = torch.linalg.solve(eye - P_pi.T, mdp.init.to(DTYPE) * live) * live  # expected visits
    return n / n.sum()


def softmax_entropy_grad(theta: Tensor, weights: Tensor) -> Tensor:
    """d/dtheta of sum_s weights(s) H(softmax(theta)(.|s)) with the weights held fixed, in
    closed form: -weights(s) pi(a|s) (log pi(a|s) + H(s)), H(s) = -sum_b pi(b|s) log pi(b|s).
    The entropy bonus of a softmax policy's update at fixed (e.g. sampled) states; the result is
    differentiable in theta and in the weights. theta: (S, A) logits, weights: (S,) -> (S, A).
    """
    logp = torch.log_softmax(theta, -1)  # (S, A)
    pi = logp.exp()
    ent = -(pi * logp).sum(-1, keepdim=True)  # (S, 1)
    return -weights[:, None] * pi * (logp + ent)


def greedy(q: Tensor) -> Tensor:
    """Deterministic policy taking the first argmax of Q in each state, as one-hot (S, A)."""
    return torch.nn.functional.one_hot(q.argmax(-1), q.shape[-1]).to(DTYPE)


def value_iteration(mdp: TabularMDP, tol: float = 1e-10, max_iters: int = 10_000):
    """V_{k+1}(s) = max_a [R(s, a) + gamma sum_s' P(s'|s, a) V_k(s')] until the sup-norm change
    is below ``tol``. Returns (V*, greedy pi*, number of sweeps, list of sup-norm changes).
    """
    v = torch.zeros(mdp.num_states, dtype=DTYPE, device=mdp.P.device)
    deltas = []
    for k in range(1, max_iters + 1):
        v_new = q_from_v(mdp, v).max(-1).values
        deltas.append((v_new - v).abs().max().item())
        v = v_new
        if deltas[-1] < tol:
            break
    return v, greedy(q_from_v(mdp, v)), k, deltas


def policy_iteration(mdp: TabularMDP, pi: Tensor | None = None, max_iters: int = 1000):
    """Evaluate exactly, improve greedily, until the policy is stable.

    Ties keep the current action when it is among the maximisers (so the loop terminates).
    Returns (V*, pi*, number of improvement steps). The start policy must be proper when gamma=1.
    """
    pi = uniform_policy(mdp) if pi is None else pi.to(DTYPE)
    for k in range(1, max_iters + 1):
        v = policy_evaluation(mdp, pi)
        q = q_from_v(mdp, v)
        best = q.max(-1, keepdim=True).values
        current_is_best = ((pi > 0) & (q >= best - 1e-12)).any(-1, keepdim=True)
        new_pi = torch.where(current_is_best & (pi.max(-1, keepdim=True).values == 1.0), pi, greedy(q))
        if torch.equal(new_pi, pi):
            return v, pi, k
        pi = new_pi
    return policy_evaluation(mdp, pi), pi, max_iters


def finite_horizon_advantages(mdp, pi, horizon: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact A^pi_t(s, a) and V^pi_t(s) of a policy pi when the episode is cut after ``horizon``
    turns. With h = horizon - t turns left:

        V_0 = 0,  Q_h(s, a) = R(s, a) + gamma sum_s' P(s'|s, a) V_{h-1}(s')  (0 at terminals),
        V_h(s) = sum_a pi_t(a|s) Q_h(s, a),  A_t = Q_{H-t} - V_{H-t}.

    pi: (S, A) stationary, or (H, S, A) one policy per turn t = 0..H-1 (an agent that reads the
    turn counter, e.g. an LM whose observation says "Turn t/H").
    Returns (A, V) of shapes (H, S, A) and (H, S), indexed by the turn t = 0..H-1.
    """
    pi = torch.as_tensor(pi, dtype=torch.float64, device=mdp.P.device)
    if pi.dim() == 3 and pi.shape[0] != horizon:
        raise ValueError(f"a per-turn policy needs {horizon} rows, got {pi.shape[0]}")
    live = (~mdp.terminal).to(torch.float64)  # (S,)
    v = torch.zeros(mdp.num_states, dtype=torch.float64, device=mdp.P.device)
    adv, val = [], []
    for h in range(1, horizon + 1):
        pi_t = pi[horizon - h] if pi.dim() == 3 else pi  # (S, A) at turn t = H - h
        q = (mdp.R + mdp.gamma * torch.einsum("sat,t->sa", mdp.P, v)) * live[:, None]  # (S, A)
        v = (pi_t * q).sum(-1)  # (S,)
        adv.append(q - v[:, None])
        val.append(v)
    return torch.stack(adv[::-1]), torch.stack(val[::-1])  # (H, S, A), (H, S)


def alive_distribution(mdp, pi, horizon: int) -> torch.Tensor:
    """d_t(s) = P(s_t = s and the episode still running at turn t), t = 0..H-1. (H, S)"""
    pi = torch.as_tensor(pi, dtype=torch.float64, device=mdp.P.device)
    live = (~mdp.terminal).to(torch.float64)
    P_pi = torch.einsum("sa,sat->st", pi, mdp.P)  # (S, S)
    d = mdp.init.to(torch.float64) * live
    out = []
    for _ in range(horizon):
        out.append(d)
        d = (d @ P_pi) * live
    return torch.stack(out)  # (H, S)


def exact_pg_direction(mdp, pi, horizon: int) -> torch.Tensor:
    """E[sum_t A_t(s_t, a_t) (onehot(a_t) - pi(s_t))] per episode, with the exact finite-horizon
    A_t: sum_t d_t(s) pi(b|s) A_t(s, b) (the -pi(s) term vanishes since sum_a pi A_t = 0). (S, A)
    No gamma^t factor: the same weighting as the sampled estimators."""
    pi = torch.as_tensor(pi, dtype=torch.float64, device=mdp.P.device)
    adv, _ = finite_horizon_advantages(mdp, pi, horizon)  # (H, S, A)
    d = alive_distribution(mdp, pi, horizon)  # (H, S)
    return torch.einsum("ts,sa,tsa->sa", d, pi, adv)


def success_within(mdp, pi, horizon: int) -> float:
    """P(a terminal state is reached within ``horizon`` turns) under ``pi``, exactly: the start
    distribution pushed ``horizon`` times through P_pi(s'|s) = sum_a pi(a|s) P(s'|s, a), then the
    mass on terminal states. It needs terminal states absorbing (their rows of P stay put, as in
    ``GridAgentEnv.tabular_form``), so that mass that reached the goal stays counted.
    pi: (S, A), or (H, S, A) with one table per turn (a policy that reads the turn).

    >>> from agentrl_lib.envs.multiturn import GridAgentEnv
    >>> env = GridAgentEnv(["..."], tasks=[((0, 0), (0, 2))], max_turns=8)
    >>> mdp = env.tabular_form((0, 0), (0, 2))
    >>> round(success_within(mdp, torch.full((3, 4), 0.25, dtype=torch.float64), 2), 4)  # 1/16
    0.0625
    """
    d = mdp.init.clone()  # (S,)
    if pi.dim() == 2:
        P_pi = torch.einsum("sa,sat->st", pi, mdp.P)  # (S, S)
        for _ in range(horizon):
            d = d @ P_pi
    else:
        for t in range(horizon):
            d = d @ torch.einsum("sa,sat->st", pi[t], mdp.P)
    return d[mdp.terminal].sum().item()
