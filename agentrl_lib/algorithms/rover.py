"""ROVER (Random Policy Valuation for Diverse Reasoning) on the TokenTreeMDP, and the GRPO /
REINFORCE baselines it is compared with.

He, Ye, Cai, Hu, Jiao, Jiang, Pan (2025), "Random Policy Valuation is Enough for LLM Reasoning
with Verifiable Rewards", arXiv:2509.24981. In a deterministic tree MDP with a binary terminal
reward, acting greedily on the Q-function of the *uniform* policy is optimal (their Theorem 3.1);
ROVER samples from ``softmax(Q^unif / tau)`` instead of the argmax to keep many correct paths.

Three ROVER variants live here, from the paper's object to the paper's LLM algorithm:

- exact:    ``softmax_policy(tree.uniform_q(), tau)``: no samples, the theorem's quantity.
- mc:       ``mc_uniform_q`` estimates Q^unif from uniform rollouts (each rollout is a uniformly
            random leaf), then the same softmax. This is "random policy valuation" by sampling.
- practical: ``estimator="rover"`` in ``train_tree``: the loss of the authors' LLM code ported to
            the tabular policy. Q is parameterised by the policy itself,
            ``Q(s_t, a_t) = rho * (log pi(a_t|s_t) - log pi_old(a_t|s_t))``, and regressed onto
            ``r~ + rho * mean_a' [log pi(a'|s_{t+1}) - log pi_old(a'|s_{t+1})]`` with r~ the
            group-mean-centred reward given at every token (the uniform-policy Bellman target:
            the next state's Q averaged over all V tokens, not over pi).

What was taken from the public reference implementation (github.com/yuxiaooye/ROVER) as fact:
the log-ratio parameterisation of Q, the ``rover_t`` (rho) = 1.0 default, the mean over the
vocabulary of the next position's log-softmax as the next-state value, the squared loss averaged
over tokens, the reward centred by the group mean (the Countdown code; the Math code uses an
asymmetric re-weighting, not used here) and broadcast to every token, no KL term, and 4
optimiser steps per rollout batch (train batch 128 prompts, mini-batch 32), and sampling at
temperature 1 in training (the Countdown config; the Math script samples at 0.6). Inferred here:
the tabular port itself (full-batch inner steps instead of mini-batches).

Shapes: G samples (the group), H = T tokens per response, V tokens in the vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch

from agentrl_lib import core
from agentrl_lib.algorithms import loop
from agentrl_lib.envs.token_tree import TokenTreeMDP, leaf_distribution
from agentrl_lib.models.policies import TabularTreePolicy
from agentrl_lib.utils import optimizer_step

Tensor = torch.Tensor


# --- the ROVER policy from a Q table -------------------------------------------------------------
def greedy_policy(q: list[Tensor]) -> list[Tensor]:
    """pi_d(a|s) = 1/|argmax| on the maximisers of Q_d(s, .), 0 elsewhere (ties split evenly).

    >>> greedy_policy([torch.tensor([[0.5, 0.5, 0.0]])])[0].tolist()
    [[0.5, 0.5, 0.0]]
    """
    out = []
    for q_d in q:  # (V^d, V)
        best = (q_d == q_d.amax(-1, keepdim=True)).to(q_d.dtype)  # (V^d, V)
        out.append(best / best.sum(-1, keepdim=True))
    return out


def softmax_policy(q: list[Tensor], tau: float) -> list[Tensor]:
    """ROVER's policy pi_d(a|s) = softmax_a(Q_d(s, a) / tau); tau = 0 is ``greedy_policy``.

    tau -> 0 tends to the greedy policy (ties split), tau -> inf to the uniform policy.

    >>> p = softmax_policy([torch.tensor([[1.0, 0.0]], dtype=torch.float64)], tau=1.0)[0]
    >>> round(p[0, 0].item(), 4)  # e / (e + 1)
    0.7311
    """
    if tau < 0:
        raise ValueError(f"tau must be >= 0, got {tau}")
    if tau == 0:
        return greedy_policy(q)
    return [torch.softmax(q_d / tau, -1) for q_d in q]


def q_proportional_policy(q: list[Tensor]) -> list[Tensor]:
    """pi_d(a|s) = Q_d(s, a) / sum_a' Q_d(s, a') (uniform where all Q are 0).

    With Q = Q^unif this samples every correct leaf with probability 1/|correct|: the most
    diverse policy with pass@1 = 1, a reference point (not the paper's method).
    """
    out = []
    for q_d in q:  # (V^d, V)
        total = q_d.sum(-1, keepdim=True)  # (V^d, 1)
        uniform = torch.full_like(q_d, 1.0 / q_d.shape[-1])
        out.append(torch.where(total > 0, q_d / total.clamp(min=1e-300), uniform))
    return out


def implied_pass_at_1(q: list[Tensor], probs: list[Tensor]) -> Tensor:
    """pass@1 of ``probs`` under the leaf reward that ``q`` itself implies, ``q[-1]`` flattened.

    For Q^unif the last-depth Q *is* the reward, so this is exact. For an MC estimate, unvisited
    leaves count as wrong, so it is a lower bound on the true pass@1 (reward is deterministic).
    """
    return (leaf_distribution(probs) * q[-1].reshape(-1)).sum()


def temperature_for_pass1(q: list[Tensor], floor: float, taus: list[float]) -> float:
    """The largest tau in ``taus`` whose ``implied_pass_at_1`` is >= floor, else the smallest tau.

    Uses only the Q table (no ground truth beyond it): the most diverse ROVER policy that still
    meets a pass@1 floor fixed in advance.
    """
    ordered = sorted(taus)
    for tau in reversed(ordered):
        if implied_pass_at_1(q, softmax_policy(q, tau)).item() >= floor:
            return float(tau)
    return float(ordered[0])


# --- Monte-Carlo valuation of the uniform policy ------------------------------------------------
def uniform_rollouts(tree: TokenTreeMDP, num: int,
                     generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """``num`` rollouts of the uniform policy: (leaf_ids (B,), rewards (B,)).

    Drawing every token uniformly is drawing the leaf uniformly, so this samples leaf ids.
    """
    leaf_ids = torch.randint(tree.num_leaves, (num,), generator=generator)  # (B,)
    return leaf_ids, tree.reward[leaf_ids]


def mc_uniform_q(leaf_ids: Tensor, rewards: Tensor, vocab_size: int, depth: int,
                 fill: float = 0.0) -> tuple[list[Tensor], list[Tensor]]:
    """Monte-Carlo Q^unif from uniform rollouts: Q_hat_d(s, a) = mean reward of the rollouts that
    pass through the child (s, a); ``fill`` where no rollout did.

    leaf_ids, rewards: (B,). Returns (q_hat, counts), each a list of H tensors (V^d, V).
    Every rollout through a child continues uniformly below it, so each is an unbiased sample
    of Q^unif(s, a) and Q_hat_d(s, a) has variance Q(1 - Q) / count.
    """
    V, H = vocab_size, depth
    q_hat, counts = [], []
    w = rewards.to(torch.float64)
    for d in range(H):
        child = leaf_ids // V ** (H - d - 1)  # (B,) node id at depth d + 1
        n = torch.bincount(child, minlength=V ** (d + 1)).to(torch.float64)  # (V^(d+1),)
        s = torch.bincount(child, weights=w, minlength=V ** (d + 1))  # (V^(d+1),)
        q = torch.where(n > 0, s / n.clamp(min=1.0), torch.full_like(s, fill))
        q_hat.append(q.reshape(V**d, V))
        counts.append(n.reshape(V**d, V))
    return q_hat, counts


# --- metrics ---------------------------------------------------------------------------------
def evaluate(tree: TokenTreeMDP, probs: list[Tensor], ks=(1, 16, 256), num_samples: int = 64,
             generator: torch.Generator | None = None) -> dict[str, float]:
    """Exact pass@1 and pass@k, the expected number of distinct correct leaves among
    ``num_samples`` i.i.d. samples (exact) and one sampled count, and the entropy (nats) of the
    policy's distribution over correct leaves given that it is correct."""
    p_leaf = leaf_distribution(probs)  # (V^H,)
    p_correct = p_leaf[tree.correct_ids]  # (C,)
    j = p_correct.sum().item()
    out = {"pass@1": j}
    for k in ks:
        out[f"pass@{k}"] = 1.0 - (1.0 - j) ** k
    out["distinct_expected"] = (1.0 - (1.0 - p_correct) ** num_samples).sum().item()
    leaves = torch.multinomial(p_leaf.float(), num_samples, replacement=True, generator=generator)
    hit = tree.reward[leaves] > 0
    out["distinct_sampled"] = float(torch.unique(leaves[hit]).numel())
    cond = p_correct / max(j, 1e-300)
    cond = cond[cond > 0]
    out["entropy_correct"] = float(-(cond * cond.log()).sum().item()) if j > 0 else 0.0
    return out


# --- training on the tree: GRPO, REINFORCE and practical ROVER ---------------------------------
ESTIMATORS = ("grpo", "dr_grpo", "reinforce", "rover")


@dataclass
class TreeRLConfig:
    """One config for the trainers; ``estimator`` picks the update."""

    estimator: str = "grpo"
    """'grpo': clipped surrogate with group-normalised advantages (``core.group_advantages``);
    'dr_grpo': the same with the group-mean-centred reward (no std division); 'reinforce': the
    same surrogate with the raw reward as the weight (no baseline; with num_epochs=1 it is plain
    REINFORCE); 'rover': the practical ROVER regression."""
    num_iters: int = 100
    """rollout batches; the sample budget is num_iters * group_size responses."""
    group_size: int = 16
    """G responses sampled per batch (the paper's runs use 8 per prompt)."""
    lr: float = 0.1
    """Adam learning rate on the tabular logits."""
    num_epochs: int = 4
    """optimiser steps per rollout batch, each on the full batch (the reference takes 128/32 = 4
    mini-batch steps)."""
    clip_eps: float = 0.2
    """PPO/GRPO clip range (not ROVER)."""
    rho: float = 1.0
    """ROVER temperature: Q = rho * log(pi / pi_old) (``rover_t`` = 1.0 in the reference)."""
    eval_every: int = 10
    """iterations between exact evaluations (pass@1, distinct correct, entropy)."""
    eval_samples: int = 64
    """N in 'expected distinct correct leaves among N samples' during training."""

    def __post_init__(self):
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"unknown estimator {self.estimator!r}; expected one of {ESTIMATORS}")


def mean_logps(policy: TabularTreePolicy, nodes: Tensor) -> Tensor:
    """mean_a log pi(a | s_t) at each visited state: nodes (B, T) -> (B, T).

    The uniform average of the log-policy, which the reference calls ``sum_log_softmax``.
    """
    cols = [torch.log_softmax(policy.logits[d][nodes[:, d]], -1).mean(-1)
            for d in range(nodes.shape[1])]
    return torch.stack(cols, -1)


def rover_loss(logps: Tensor, old_logps: Tensor, mean_logps_t: Tensor, old_mean_logps_t: Tensor,
               rewards_centred: Tensor, rho: float = 1.0,
               mask: Tensor | None = None) -> tuple[Tensor, dict[str, float]]:
    """Practical ROVER loss, to be minimised.

    Q_t      = rho * (logps_t - old_logps_t)                                    (B, T)
    y_t      = r~ + rho * (mean_logps_{t+1} - old_mean_logps_{t+1})  for t < T-1,  y_{T-1} = r~
    L        = mean_t (Q_t - stopgrad(y_t))^2

    logps, old_logps: log pi(a_t|s_t) now and at sampling time (B, T); mean_logps_t,
    old_mean_logps_t: mean over the vocabulary of log pi(.|s_t) (B, T); rewards_centred: (B,)
    r - mean(r) of the group. The next-state term is mean_a' Q(s_{t+1}, a'): the value of the
    uniform policy, not of pi, which is what makes this a *random policy* valuation.
    """
    q = rho * (logps - old_logps)  # (B, T)
    next_q = rho * (mean_logps_t[:, 1:] - old_mean_logps_t[:, 1:])  # (B, T-1)
    next_q = torch.cat([next_q, torch.zeros_like(next_q[:, :1])], -1)  # (B, T)
    target = (rewards_centred[:, None] + next_q).detach()  # (B, T)
    loss = core.masked_mean((q - target) ** 2, mask)
    return loss, {"q_mean": q.mean().item(), "next_q_mean": next_q.mean().item()}


def train_tree(tree: TokenTreeMDP, cfg: TreeRLConfig,
               generator: torch.Generator | None = None) -> tuple[TabularTreePolicy, list[dict]]:
    """Train a ``TabularTreePolicy`` (uniform at start) on one tree with ``cfg.estimator``.

    Returns the policy and the rows of ``loop.run`` that carry an exact evaluation (at the start,
    every ``cfg.eval_every`` updates and after the last): {iter, samples (responses drawn so far),
    eval/pass@1, eval/distinct_expected, eval/entropy_correct, ...}.
    """
    policy = TabularTreePolicy(tree)
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    G = cfg.group_size

    @torch.no_grad()
    def exact_eval(policy) -> dict:
        m = evaluate(tree, policy.probs(), ks=(), num_samples=cfg.eval_samples, generator=generator)
        return {k: m[k] for k in ("pass@1", "distinct_expected", "entropy_correct")}

    @torch.no_grad()
    def sample(policy, it: int) -> SimpleNamespace:
        tokens, nodes, _, r = tree.sample(policy.probs(), G, generator=generator)  # (G, H) x2
        return SimpleNamespace(metrics={"samples": (it + 1) * G}, tokens=tokens, nodes=nodes, r=r,
                               old_logps=policy.log_prob(nodes, tokens),  # (G, H)
                               old_mean=(mean_logps(policy, nodes) if cfg.estimator == "rover"
                                         else None))  # (G, H)

    def update(b: SimpleNamespace, it: int) -> dict:
        if cfg.estimator == "rover":
            r_centred = core.group_advantages(b.r[None], "dr_grpo")[0]  # (G,)
        else:
            adv = core.group_advantages(b.r[None], cfg.estimator)[0]  # (G,)
        for _ in range(cfg.num_epochs):
            logps = policy.log_prob(b.nodes, b.tokens)  # (G, H)
            if cfg.estimator == "rover":
                loss, _ = rover_loss(logps, b.old_logps, mean_logps(policy, b.nodes), b.old_mean,
                                     r_centred, rho=cfg.rho)
            else:
                loss, _ = core.ppo_clip_loss(logps, b.old_logps, adv[:, None].expand(G, tree.H),
                                             clip_eps=cfg.clip_eps)
            optimizer_step(opt, loss)
        return {}

    rows = loop.run(policy, sample, update, cfg.num_iters, evaluate=exact_eval,
                    eval_every=cfg.eval_every, start={"samples": 0}, desc="rover")
    return policy, loop.eval_rows(rows)
