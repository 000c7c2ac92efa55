"""Policy gradients from REINFORCE to GRPO: advantages, the surrogate loss, exact and sampled
gradients on a set of token-tree prompts, and a plain training loop.

The score-function (likelihood-ratio) identity (Williams 1992; Sutton et al. 2000) for a response
y = (a_0, ..., a_{T-1}) sampled from pi_theta given prompt x:

    grad J = E_x E_{y ~ pi(.|x)} [ (r(x, y) - b) * sum_t grad log pi(a_t | x, a_<t) ]

for any baseline b that does not depend on y. With B prompts and G samples per prompt every
estimator here is

    g_hat = 1/(B G) sum_{b, i} A_{b,i} sum_t grad log pi(a_{b,i,t} | s_{b,i,t})          (1)

and differs only in the advantage A_{b,i} built from the rewards r (B, G), by
``core.group_advantages``:

    'reinforce'   A = r                                    no baseline (Williams 1992)
    'batch_mean'  A = r - mean of all B*G rewards          the mean includes r_{b,i} itself
    'rloo'        A = r - mean_{j != i} r_{b,j}            Kool et al. 2019; Ahmadian et al. 2024,
                                                           arXiv:2402.14740
    'grpo'        A = (r - mean_j r_{b,j}) / (std_j r_{b,j} + eps)
                                                           Shao et al. 2024, arXiv:2402.03300
    'dr_grpo'     A = r - mean_j r_{b,j}                   Liu et al. 2025, arXiv:2503.20783

REINFORCE and RLOO are unbiased. A baseline that contains the sample itself shrinks the gradient:
E[g_hat] = (1 - 1/n) grad J with n the number of rewards averaged (n = G for 'dr_grpo', B*G for
'batch_mean'). GRPO's std division multiplies prompt b's gradient by a factor c_G(p_b) that depends
on its success rate p_b, so its expectation is not parallel to grad J when prompts differ
(``expected_gradient_scale``). The group std uses ddof=1 as in ``agentrl_lib.core`` and TRL.

Since every response in a token tree has the same length, Dr. GRPO's other change (no 1/|o_i|
length normalisation) does not show here; the loss sums log-probs over tokens (eq. 1).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from types import SimpleNamespace

import torch

from agentrl_lib.algorithms import loop
from agentrl_lib.core import ESTIMATORS as ALL_ESTIMATORS
from agentrl_lib.core import group_advantages, masked_mean
from agentrl_lib.envs.token_tree import TokenTreeMDP
from agentrl_lib.models.policies import PromptSetPolicy
from agentrl_lib.utils import optimizer_step

Tensor = torch.Tensor
# the estimators of eq. (1) analysed here (``core.group_advantages`` computes them all; Lite-PPO's
# and REINFORCE++'s batch std are left to the LM notebooks)
ESTIMATORS = tuple(e for e in ALL_ESTIMATORS if e not in ("lite_ppo", "reinforce_pp"))


def pg_surrogate_loss(
    logps: Tensor, advantages: Tensor, mask: Tensor | None = None
) -> tuple[Tensor, dict[str, float]]:
    """The surrogate whose negative gradient is eq. (1), to be minimised:

        L = -1/N sum_i A_i * sum_t m_{i,t} log pi(a_{i,t} | s_{i,t})

    logps: (..., T) per-token log-probs; advantages: (...) one per response (treated as constants);
    mask: (..., T) which tokens count (all when None). N is the number of responses (all leading
    entries). Its value is not J; only its gradient matters.

    >>> logps = torch.log(torch.tensor([[0.5, 0.5], [0.25, 1.0]]))  # 2 responses, T = 2
    >>> round(pg_surrogate_loss(logps, torch.tensor([1.0, 0.5]))[0].item(), 6)  # -1.5 log(1/4) / 2
    1.039721
    """
    if mask is None:
        mask = torch.ones_like(logps)
    seq_logps = (logps * mask.to(logps.dtype)).sum(-1)  # (...)
    adv = advantages.detach().to(logps.dtype)
    loss = -(adv * seq_logps).mean()
    with torch.no_grad():
        metrics = {
            "adv_mean": adv.mean().item(),
            "adv_abs_mean": adv.abs().mean().item(),
            "frac_zero_adv": (adv == 0).to(logps.dtype).mean().item(),
            "tokens_per_response": masked_mean(mask.to(logps.dtype).sum(-1)).item(),
        }
    return loss, metrics


def expected_gradient_scale(
    p: Tensor | float, group_size: int, estimator: str, ddof: int = 1, eps: float = 1e-4,
    num_groups: int = 1,
) -> Tensor:
    """c(p) with E[prompt b's part of eq. (1)] = c(p_b) * grad p_b / B, for rewards in {0, 1}.

    With binary rewards only r_i and the other samples' rewards enter A_i, and
    E[grad log pi(y) | r(y) = 1] = grad p / p, E[grad log pi(y) | r(y) = 0] = -grad p / (1 - p), so

        c(p) = E_k[ A(r_i = 1, k) - A(r_i = 0, k) ],   k ~ Binomial(G - 1, p)

    where k counts the successes among the other G - 1 samples.

    'reinforce' and 'rloo' give 1, 'dr_grpo' (G-1)/G, 'batch_mean' 1 - 1/(B G) with B = num_groups;
    'grpo' gives a function of p, except at G = 2 where it is (1/2) / std([0, 1]) = 1/sqrt(2) with
    ddof=1 (and 1 with ddof=0) for every p. Any parameterisation of pi.

    >>> round(expected_gradient_scale(0.3, 4, "dr_grpo").item(), 6)
    0.75
    >>> round(expected_gradient_scale(0.3, 2, "grpo", eps=0.0).item(), 6)  # 0.5 / std([0, 1])
    0.707107
    """
    p = torch.as_tensor(p, dtype=torch.float64)
    g = group_size
    if estimator in ("reinforce", "rloo"):
        return torch.ones_like(p)
    if estimator == "batch_mean":
        return torch.full_like(p, 1.0 - 1.0 / (num_groups * g))
    if estimator == "dr_grpo":
        return torch.full_like(p, (g - 1) / g)
    if estimator != "grpo":
        raise ValueError(f"unknown estimator {estimator!r}; expected one of {ESTIMATORS}")
    if g < 2:
        return torch.zeros_like(p)
    out = torch.zeros_like(p)
    for k in range(g):  # k successes among the other G - 1 samples
        weight = float(math.comb(g - 1, k)) * p**k * (1 - p) ** (g - 1 - k)
        diff = 0.0
        for r_i in (1, 0):
            n1 = r_i + k  # ones in the whole group
            mean = n1 / g
            std = math.sqrt(n1 * (g - n1) / g / (g - ddof)) if g > ddof else 0.0
            a = 0.0 if n1 in (0, g) else (r_i - mean) / (std + eps)
            diff += a if r_i == 1 else -a
        out = out + weight * diff
    return out


# --- a set of B token-tree prompts, stacked -----------------------------------------------------
# Prompt b is a TokenTreeMDP with its own correct leaves and its own softmax tables. Stacking the B
# prompts (same V and H) turns sampling, log-probs and exact values into a few batched ops; the
# notebook checks each against TokenTreeMDP / TabularTreePolicy one prompt at a time.
def stack_rewards(trees: list[TokenTreeMDP]) -> Tensor:
    """Leaf rewards of B trees with the same V and H, stacked. (B, V^H)"""
    if any((t.V, t.H) != (trees[0].V, trees[0].H) for t in trees):
        raise ValueError("every prompt's tree needs the same vocab_size and depth")
    return torch.stack([t.reward for t in trees])


def expected_rewards(reward: Tensor, probs: list[Tensor]) -> Tensor:
    """Exact J_b = P(correct leaf | prompt b) by the backward recursion V_d = sum_a pi Q_d. (B,)

    reward: (B, V^H); probs: H tables (B, V^d, V). Differentiable in probs.
    """
    b, v = reward.shape[0], probs[0].shape[-1]
    val = reward.to(probs[0].dtype)  # (B, V^H)
    for d in range(len(probs) - 1, -1, -1):
        val = (probs[d] * val.reshape(b, v**d, v)).sum(-1)  # (B, V^d)
    return val[:, 0]


def objective(reward: Tensor, probs: list[Tensor]) -> Tensor:
    """J = 1/B sum_b J_b: the mean exact pass@1 over the prompt set (a scalar)."""
    return expected_rewards(reward, probs).mean()


def flatten_tables(tables: list[Tensor]) -> Tensor:
    """H tables (..., B, V^d, V) -> (..., B, P_b) with P_b = sum_d V^d V: one row per prompt."""
    return torch.cat([t.flatten(-2) for t in tables], -1)


def exact_gradient(reward: Tensor, policy: PromptSetPolicy) -> Tensor:
    """grad J by autograd through the exact recursion. (B, P_b), laid out by ``flatten_tables``."""
    grads = torch.autograd.grad(objective(reward, policy.probs()), list(policy.logits))
    return flatten_tables(list(grads))


def sample_responses(reward: Tensor, probs: list[Tensor], num: int,
                     generator: torch.Generator | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """``num`` responses per prompt. Returns tokens, nodes (B, N, H) and rewards (B, N);
    nodes[..., d] is the state (prefix id) at step d, as in TokenTreeMDP.sample."""
    b, v, h = reward.shape[0], probs[0].shape[-1], len(probs)
    node = torch.zeros(b, num, dtype=torch.long)  # (B, N)
    tokens = torch.empty(b, num, h, dtype=torch.long)
    nodes = torch.empty(b, num, h, dtype=torch.long)
    for d in range(h):
        nodes[..., d] = node
        p = probs[d].gather(1, node[..., None].expand(-1, -1, v))  # (B, N, V)
        a = torch.multinomial(p.reshape(-1, v).float(), 1, generator=generator).reshape(b, num)
        tokens[..., d] = a
        node = node * v + a
    return tokens, nodes, reward.gather(1, node)


def tabular_score_gradient(probs: list[Tensor], nodes: Tensor, tokens: Tensor,
                           weights: Tensor) -> Tensor:
    """sum_i w_i sum_t grad log pi(a_{i,t} | s_{i,t}) for softmax tables in closed form, per draw.

    d log softmax(theta[n])_a / d theta[n'] = 1[n' = n] (e_a - pi(.|n)): depth d's table gets w_i
    at (node_i, a_i) minus (the sum of w_i over the samples at that node) * pi(.|node).
    probs: H tables (B, V^d, V); nodes, tokens: (K, B, N, H); weights: (K, B, N) for K
    independent draws. Returns (K, B, P_b), laid out by ``flatten_tables``.
    """
    k, b, _, h = nodes.shape
    out = []
    for d in range(h):
        _, rows, v = probs[d].shape
        w = weights.to(probs[d].dtype)
        hits = torch.zeros(k, b, rows * v, dtype=w.dtype)  # (K, B, V^d V)
        hits.scatter_add_(-1, nodes[..., d] * v + tokens[..., d], w)
        visits = torch.zeros(k, b, rows, dtype=w.dtype)  # (K, B, V^d)
        visits.scatter_add_(-1, nodes[..., d], w)
        out.append(hits - (visits[..., None] * probs[d]).flatten(-2))  # (K, B, V^d V)
    return torch.cat(out, -1)


def sampled_gradients(reward: Tensor, policy: PromptSetPolicy, estimator: str, group_size: int,
                      num_draws: int, generator: torch.Generator | None = None, ddof: int = 1,
                      eps: float = 1e-4, reward_shift: float = 0.0) -> tuple[Tensor, Tensor]:
    """``num_draws`` independent estimates of grad J by eq. (1), each from G responses per prompt.

    Returns (grads (K, B, P_b) laid out like ``exact_gradient``, rewards (K, B, G)).
    ``reward_shift`` adds a constant to every reward (grad J does not change).
    """
    with torch.no_grad():
        probs = policy.probs()
        tokens, nodes, r = sample_responses(reward, probs, num_draws * group_size, generator)
        b, h = reward.shape[0], len(probs)
        tokens = tokens.reshape(b, num_draws, group_size, h).transpose(0, 1)  # (K, B, G, H)
        nodes = nodes.reshape(b, num_draws, group_size, h).transpose(0, 1)  # (K, B, G, H)
        rewards = r.reshape(b, num_draws, group_size).transpose(0, 1) + reward_shift  # (K, B, G)
        adv = group_advantages(rewards, estimator, ddof=ddof, eps=eps)  # (K, B, G)
        grads = tabular_score_gradient(probs, nodes, tokens, adv / (b * group_size))
    return grads, rewards


# --- training --------------------------------------------------------------------------------
@dataclass
class PGConfig:
    """One policy-gradient run on a set of token-tree prompts: plain SGD on eq. (1)."""

    estimator: str = "rloo"
    """advantage estimator: 'reinforce' | 'batch_mean' | 'rloo' | 'grpo' | 'dr_grpo'"""
    group_size: int = 8
    """G responses sampled per prompt per update (the budget: B*G responses per update)"""
    num_iters: int = 200
    """gradient steps (one sampling round each)"""
    lr: float = 1.0
    """SGD step size on the logits, the same for every estimator"""
    ddof: int = 1
    """delta degrees of freedom of GRPO's group std (1 as in TRL and agentrl_lib.core)"""
    eps: float = 1e-4
    """GRPO's std guard, as in TRL"""
    reward_shift: float = 0.0
    """a constant added to every sampled reward (a bonus every response gets)"""
    seed: int = 0
    """seeds the sampling generator"""


def train_pg(trees: list[TokenTreeMDP], cfg: PGConfig) -> dict:
    """Train a PromptSetPolicy from uniform with eq. (1); J is evaluated exactly after each update.

    trees: the B prompts (same V and H). Returns {'J': (num_iters + 1) values of the exact mean
    pass@1, before the first update and after each; 'J_per_prompt': (num_iters + 1, B);
    'samples': responses drawn by each point; 'metrics': one row per update (``rollout/reward``
    and the ``losses/*`` of ``pg_surrogate_loss``); 'policy'; 'config'}.
    """
    gen = torch.Generator().manual_seed(cfg.seed)
    reward = stack_rewards(trees)  # (B, V^H)
    b = reward.shape[0]
    policy = PromptSetPolicy(b, trees[0].V, trees[0].H)
    opt = torch.optim.SGD(policy.parameters(), lr=cfg.lr)

    @torch.no_grad()
    def exact_eval(policy) -> dict:
        return {"J_per_prompt": expected_rewards(reward, policy.probs())}  # (B,)

    def sample(policy, it: int) -> SimpleNamespace:
        with torch.no_grad():
            tokens, nodes, r = sample_responses(reward, policy.probs(), cfg.group_size, gen)
        r = r + cfg.reward_shift  # (B, G)
        return SimpleNamespace(tokens=tokens, nodes=nodes, r=r,
                               metrics={"rollout/reward": r.mean().item()})

    def update(batch: SimpleNamespace, it: int) -> dict:
        adv = group_advantages(batch.r, cfg.estimator, ddof=cfg.ddof, eps=cfg.eps)  # (B, G)
        loss, m = pg_surrogate_loss(policy.log_prob(batch.nodes, batch.tokens), adv)  # (B, G, H)
        optimizer_step(opt, loss)
        return {f"losses/{k}": v for k, v in m.items()}

    rows = loop.run(policy, sample, update, cfg.num_iters, evaluate=exact_eval, desc="pg")
    per_prompt = torch.stack([r.pop("eval/J_per_prompt") for r in rows])  # (U + 1, B)
    n = b * cfg.group_size
    metrics = [{k: v for k, v in r.items() if k.startswith(("rollout/", "losses/"))}
               for r in rows[1:]]
    return {"J": per_prompt.mean(-1).tolist(), "J_per_prompt": per_prompt.tolist(),
            "samples": [i * n for i in range(len(per_prompt))], "metrics": metrics,
            "policy": policy, "config": asdict(cfg)}
