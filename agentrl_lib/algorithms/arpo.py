"""ARPO and AEPO: entropy-triggered tree rollouts for tool-using agents, shared-prefix advantage
attribution, and AEPO's entropy balancing.

ARPO (Dong et al. 2025, "Agentic Reinforced Policy Optimization", arXiv:2507.19849) observes that
an LLM agent's token entropy rises right after a tool response, and spends its rollout budget there:

**Entropy-based adaptive rollout** (``tree_rollout``, ``rollout='arpo'``). A task gets a budget of
M leaves (``group_size``). N = ``num_global`` trajectories are sampled from the root; H_init is the
policy's entropy at the first step. Walking a path, at every step t that follows a tool response the
normalised entropy change and the branch score are

    dH_t = (H_t - H_init) / log|A|             (``entropy_change``; log|A|: the largest entropy)
    P_t  = clip(alpha + beta * dH_t, 0, 1)     (``branch_probability``)

and with probability P_t (one uniform draw per post-tool step) the path forks ``num_branches`` (Z)
partial rollouts that share its prefix and sample afresh from step t on (the path itself goes on).
This is the released code's rule (github.com/dongguanting/ARPO,
``verl_arpo_entropy/verl/workers/rollout/vllm_rollout_with_tools.py``, ``generate_sequences``:
``prob = clip(random.random() - entropy_weight * entropy_delta, 0, 1)``, no branch where ``prob >
branch_probability``, i.e. a branch with probability clip(branch_probability + entropy_weight dH),
with ``branch_probability`` = 0.5 = alpha and ``entropy_weight`` = 0.2 = beta in every released
script); the paper's text (sec. 3.1) writes the same score against a threshold tau.
``fork_rule='random'`` drops the entropy term (P_t = alpha at every post-tool step): the same
budget spent blind, the baseline that isolates the entropy trigger. Forking stops when the tree
has M leaves;
if every path ends first, more global trajectories fill the budget. A shared prefix is played once,
so its tool calls are paid once: ``tool_calls`` counts the tree's distinct tool-call steps.

**Advantage attribution** (``attribute``). Each leaf's advantage is its return normalised among
the task's M leaves (GRPO's, ``credit.group_normalise``). A step shared by the leaves L(s):
'hard' (paper sec. 3.2) gives **each copy** the mean advantage of L(s), so the copies sum to
|L(s)| x the mean; 'soft' keeps every copy's own leaf advantage (each leaf a GRPO row, the paper's
default and the only form in the released code); the copies sum to |L(s)| x the mean too, so at
rho = 1 (one epoch) hard and soft give the same gradient. 'hard_split' (this library's earlier
reading, kept as a named variant and as the control that must fail that equality) gives each copy
mean / |L(s)|: the shared step counted once, a 1/|L(s)| down-weighting. Unshared steps get their
leaf's advantage in every mode.

AEPO (Dong et al. 2025, "Agentic Entropy-Balanced Policy Optimization", arXiv:2510.14545) finds that
ARPO over-branches (consecutive high-entropy steps fork the same lineage again and again) and that
PPO's clip removes the gradient of high-entropy tokens. Its cells here (``rollout='aepo'``):

- entropy pre-monitoring: the global share of the budget is sigma(kappa (H_root - H_tool)) (more
  global sampling when the question is more uncertain than the tool steps, more branching
  otherwise): N = clip(int(M sigma(.)) + 1, 1, M) (``global_count``), kappa = 0.5, H_tool from
  the first global path's post-tool steps;
- the consecutive-branch penalty (``aepo_branch_probability``): a post-tool step's draw is
  (u + beta dH_t) f_l against alpha, f_l = max(0, 1 - penalty l) with penalty = 0.05 and l the
  number of consecutive tool rounds just before this one in which the task forked: the fork
  probability is clip(1 - alpha / f_l + beta dH_t, 0, 1) (0 when f_l = 0);
- stop-gradient clipping (``sg_clip_loss``): where PPO's clip is active on the upper side
  (A > 0, rho > 1 + eps) the term -sg((1 + eps) / rho) rho A keeps the clipped value and a
  gradient -(1 + eps) A grad log pi instead of none (on every token, as the code);
- entropy-aware advantages (``entropy_aware_advantages``): A_t (1 + gamma_h z_t), z_t the step's
  entropy z-scored over the update's batch, gamma_h = 0.2.

Taken from the papers and the code (``reproductions/fidelity/55_arpo.md``, ``56_aepo.md``): the
branch probability clip(alpha + beta dH) with alpha = 0.5, beta = 0.2 (code), forking at post-tool
steps under a leaf budget M with N initial global samples, refilling with global samples, hard
(the mean on each copy, paper sec. 3.2) and soft attribution (soft the default); AEPO's pieces as
the released code writes them (read in copies of ``AEPO/verl_aepo_entropy`` held by the file
index: the rollout's ``_calculate_initial_rollouts_dynamical`` and branching loop with
``consecutive_branches``, ``core_algos.compute_policy_loss_entropy_balanced_clipping``): the
pre-monitoring count int(n sigma(0.5 (H_root - H_tool))) + 1, the linear penalty 0.05 per
consecutive forking round of the task, the stop-gradient clip on every token and the z-scored
entropy weight 0.2. Inferred (not fixed by what we read): dH normalised by log|A| (the code
divides by log V); H_init as the first step's entropy; the forking path continues besides its
Z forks, and a fork resamples step t itself (the code: the step after the next tool response);
a tool round as the number of tool calls in the path's prefix, with paths played one after the
other (the code plays all paths of a task in lockstep rounds, so a path here sees the forks of
the paths played before it); the pre-monitoring path is one of the M leaves (the code plays an
extra one, and its released scripts turn pre-monitoring off); entropies z-scored with torch's
unbiased std (1 where it is 0).

The tabular loop ``train`` plays trees with a ``KeyTablePolicy`` (``policy.probs`` of the state
key), attributes advantages and takes ``agent_pg.update``'s PPO step; ``rollout='global'`` (M
independent trajectories, no forks) with soft attribution is trajectory-level GRPO, the baseline.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import torch

from agentrl_lib.algorithms import agent_pg, credit, loop
from agentrl_lib.rollout import Episode, episode_stats, fork_episode, record_step, truncate

ROLLOUTS = ("global", "arpo", "aepo")
ATTRIBUTIONS = ("soft", "hard", "hard_split")
FORK_RULES = ("entropy", "random")


# --- the pure pieces -----------------------------------------------------------------------------
def entropy(probs) -> float:
    """H(p) = -sum_a p_a log p_a (0 log 0 = 0)."""
    p = np.asarray(probs, dtype=np.float64)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def entropy_change(h_t: float, h_init: float, h_max: float) -> float:
    """dH_t = (H_t - H_init) / H_max: the step's entropy above the first step's, in units of the
    largest entropy (log|A| for |A| actions).

    >>> entropy_change(1.5, 0.5, 2.0)
    0.5
    """
    if h_max <= 0:
        raise ValueError(f"h_max must be > 0, got {h_max}")
    return (h_t - h_init) / h_max


def branch_score(delta_h: float, alpha: float, beta: float) -> float:
    """ARPO's score P_t = alpha + beta dH_t (before the clip).

    >>> branch_score(0.5, alpha=0.5, beta=1.0)
    1.0
    """
    return alpha + beta * delta_h


def branch_probability(delta_h: float, alpha: float = 0.5, beta: float = 0.2) -> float:
    """P_t = clip(alpha + beta dH_t, 0, 1): the probability that a post-tool step forks (ARPO's
    released rule, ``vllm_rollout_with_tools.py``, ``generate_sequences``; alpha =
    ``branch_probability`` 0.5, beta = ``entropy_weight`` 0.2 in its scripts).

    >>> branch_probability(0.0), branch_probability(1.0), branch_probability(-3.0, 0.5, 0.2)
    (0.5, 0.7, 0.0)
    """
    return min(max(branch_score(delta_h, alpha, beta), 0.0), 1.0)


def penalty_factor(consecutive: int, penalty: float = 0.05) -> float:
    """AEPO's factor f_l = max(0, 1 - penalty l) after l consecutive forking rounds of the task
    (the released code's ``max(0.0, 1.0 - 0.05 * consecutive_branches[orig_sample])``).

    >>> penalty_factor(0), penalty_factor(2), penalty_factor(30)
    (1.0, 0.9, 0.0)
    """
    if penalty < 0:
        raise ValueError(f"penalty must be >= 0, got {penalty}")
    return max(0.0, 1.0 - penalty * consecutive)


def aepo_branch_probability(delta_h: float, alpha: float = 0.5, beta: float = 0.2,
                            penalty: float = 0.05, consecutive: int = 0) -> float:
    """AEPO's released branching draw: prob = (u + beta dH) f_l with u ~ U(0, 1), a fork where
    prob >= alpha, i.e. P = clip(1 - alpha / f_l + beta dH, 0, 1) (0 when f_l = 0). Without a
    penalty (f = 1) and at alpha = 0.5 it is ARPO's clip(alpha + beta dH).

    >>> aepo_branch_probability(0.0), round(aepo_branch_probability(0.0, consecutive=2), 4)
    (0.5, 0.4444)
    """
    f = penalty_factor(consecutive, penalty)
    if f == 0.0:
        return 0.0
    return min(max(1.0 - alpha / f + beta * delta_h, 0.0), 1.0)


def global_count(group_size: int, h_root: float, h_tool: float, kappa: float, h_max: float) -> int:
    """AEPO's entropy pre-monitoring: N = clip(int(M sigma(kappa (H_root - H_tool) / H_max)) + 1,
    1, M) global samples of the budget M (the code's ``int(n * sigmoid(0.5 * (H_root -
    H_tool_avg))) + 1`` on entropies normalised by log V); the rest is for branching.

    >>> global_count(8, 1.0, 1.0, kappa=0.5, h_max=2.0), global_count(8, 0.0, 2.0, 100.0, 2.0)
    (5, 1)
    """
    z = kappa * (h_root - h_tool) / h_max
    return int(min(max(int(group_size / (1.0 + math.exp(-z))) + 1, 1), group_size))


def leaf_advantages(returns, norm_adv: bool = True) -> np.ndarray:
    """GRPO's advantage of each leaf of one tree: its return normalised among the tree's leaves
    (``credit.group_normalise``, ddof=1, eps=1e-4; zeros for one leaf or equal returns). (M,)"""
    return credit.group_normalise(np.asarray(returns, dtype=np.float64), norm_adv, 1, 1e-4)


def attribute(node_ids, leaf_adv, mode: str = "soft") -> list[np.ndarray]:
    """Per-step advantages of a tree's leaves from their leaf advantages.

    node_ids: per leaf, the (T_i,) ids of the tree nodes (executed steps) on its path: a shared
    prefix has the same ids. leaf_adv: (M,). 'soft': every step gets its leaf's advantage; 'hard'
    (ARPO sec. 3.2): a step shared by the leaves L(s) gets mean_{j in L(s)} A_j on each copy;
    'hard_split' (a variant): mean_{j in L(s)} A_j / |L(s)| on each copy (the mean counted once);
    an unshared step gets its leaf's in every mode.

    >>> [a.tolist() for a in attribute([[0, 1], [0, 2]], [1.0, -0.5], "hard")]
    [[0.25, 1.0], [0.25, -0.5]]
    >>> [a.tolist() for a in attribute([[0, 1], [0, 2]], [1.0, -0.5], "hard_split")]
    [[0.125, 1.0], [0.125, -0.5]]
    """
    if mode not in ATTRIBUTIONS:
        raise ValueError(f"attribution must be one of {ATTRIBUTIONS}, got {mode!r}")
    leaf_adv = np.asarray(leaf_adv, dtype=np.float64)
    if len(node_ids) != len(leaf_adv):
        raise ValueError(f"{len(node_ids)} leaves but {len(leaf_adv)} leaf advantages")
    if mode == "soft":
        return [np.full(len(ids), a) for ids, a in zip(node_ids, leaf_adv)]
    members = defaultdict(list)
    for j, ids in enumerate(node_ids):
        for n in ids:
            members[n].append(j)
    split = mode == "hard_split"
    value = {n: leaf_adv[js].mean() / (len(js) if split else 1) for n, js in members.items()}
    return [np.array([value[n] for n in ids], dtype=np.float64) for ids in node_ids]


def entropy_z(entropies) -> list[np.ndarray]:
    """Each step's entropy z-scored over every step of the batch, per episode (T_i,): (H - mean)
    / std with torch's unbiased std, std := 1 where it is 0 or undefined (the code's
    ``entropy_normalized`` over the valid response tokens of the batch).

    >>> [z.round(3).tolist() for z in entropy_z([[0.0, 1.0], [2.0]])]
    [[-1.0, 0.0], [1.0]]
    """
    flat = np.concatenate([np.asarray(h, dtype=np.float64) for h in entropies])
    std = float(flat.std(ddof=1)) if len(flat) > 1 else 0.0
    std = std if std > 0 else 1.0
    return [(np.asarray(h, dtype=np.float64) - flat.mean()) / std for h in entropies]


def entropy_aware_advantages(advantages, entropies, gamma_h: float) -> list[np.ndarray]:
    """AEPO's entropy-aware advantage (the code's): A_t (1 + gamma_h z_t), z_t the step's
    entropy z-scored over the batch (``entropy_z``), per episode (T_i,).

    >>> entropy_aware_advantages([np.array([1.0, -1.0])], [np.array([0.0, 2.0])], 0.2)[0].tolist()
    [0.8585786437626906, -1.1414213562373094]
    """
    return [np.asarray(a, dtype=np.float64) * (1.0 + gamma_h * z)
            for a, z in zip(advantages, entropy_z(entropies))]


def sg_clip_loss(logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor,
                 clip_eps: float = 0.2, entropies: torch.Tensor | None = None,
                 entropy_threshold: float | None = None) -> torch.Tensor:
    """Per-step PPO loss with AEPO's stop-gradient clip, (N,) -> (N,).

    l = -min(rho A, clip(rho, 1 - eps, 1 + eps) A), except where the clip is active on the upper
    side (A > 0, rho > 1 + eps) and the step is high-entropy (entropy > ``entropy_threshold``;
    every step when no threshold): there l = -sg((1 + eps) / rho) rho A, the same value
    -(1 + eps) A, with gradient -(1 + eps) A grad log pi where PPO's is 0.
    """
    rho = torch.exp(logps - old_logps)  # (N,)
    ppo = -torch.min(rho * advantages, rho.clamp(1 - clip_eps, 1 + clip_eps) * advantages)
    active = (advantages > 0) & (rho > 1 + clip_eps)  # (N,)
    if entropy_threshold is not None:
        if entropies is None:
            raise ValueError("entropy_threshold needs entropies")
        active = active & (entropies > entropy_threshold)
    kept = -((1 + clip_eps) / rho).detach() * rho * advantages  # (N,)
    return torch.where(active, kept, ppo)


# --- tree rollouts -------------------------------------------------------------------------------
@dataclass
class ARPOConfig:
    num_iters: int = 40
    """updates (one batch of trees each)"""
    num_prompts: int = 4
    """tasks (trees) per batch"""
    group_size: int = 8
    """M: leaves per task (GRPO: trajectories per task)"""
    rollout: str = "arpo"
    """'global' (M independent trajectories: GRPO), 'arpo' or 'aepo' (module docstring)"""
    attribution: str = "soft"
    """'soft', 'hard' or 'hard_split' shared-prefix attribution (``attribute``)"""
    num_global: int = 4
    """N: global trajectories first ('arpo'; 'aepo' sets N by pre-monitoring)"""
    num_branches: int = 1
    """Z: partial rollouts forked at a step that branches (the code's ``beam_size`` - 1 = 1)"""
    fork_rule: str = "entropy"
    """'entropy': a post-tool step forks with probability clip(alpha + beta dH); 'random': with
    probability alpha (no entropy term: the blind baseline at the same budget)"""
    alpha: float = 0.5
    """base branch probability (the code's ``branch_probability``)"""
    beta: float = 0.2
    """weight of the normalised entropy change (the code's ``entropy_weight``)"""
    penalty: float = 0.05
    """'aepo': the draw is scaled by max(0, 1 - penalty l), l the consecutive forking rounds of
    the task (the code's 0.05)"""
    kappa: float = 0.5
    """'aepo': slope of the pre-monitoring sigmoid (the code's 0.5)"""
    gamma_h: float = 0.0
    """entropy-aware advantage weight A (1 + gamma_h z) (AEPO; the code's 0.2); 0: off"""
    max_tool_calls: int | None = None
    """stop training once this many tool calls were paid (the tool-call budget); None: num_iters"""
    lr: float = 0.5
    """Adam learning rate of the table"""
    clip_eps: float = 0.2
    num_epochs: int = 1
    eval_every: int = 5
    seed: int = 0
    """seeds the task draws and the action sampling"""

    def __post_init__(self):
        if self.rollout not in ROLLOUTS:
            raise ValueError(f"rollout must be one of {ROLLOUTS}, got {self.rollout!r}")
        if self.fork_rule not in FORK_RULES:
            raise ValueError(f"fork_rule must be one of {FORK_RULES}, got {self.fork_rule!r}")
        if self.attribution not in ATTRIBUTIONS:
            raise ValueError(f"attribution must be one of {ATTRIBUTIONS}, got {self.attribution!r}")
        if not 1 <= self.num_global <= self.group_size:
            raise ValueError(f"num_global must be in 1..group_size, got {self.num_global}")
        if self.num_branches < 1:
            raise ValueError(f"num_branches must be >= 1, got {self.num_branches}")


@dataclass
class Tree:
    """One task's rollout: leaf episodes (prefix steps copied), the node ids of each leaf's steps,
    the tool calls paid (distinct tool-call nodes), forks made and where."""
    episodes: list
    node_ids: list
    tool_calls: int
    forks: int
    fork_depths: list  # the step index t of each fork
    fork_lineage: list  # l (forks already on the lineage) at each fork
    num_global: int
    fork_keys: list = None  # the policy's state key at each fork
    fork_consecutive: list = None  # at each fork: the task's consecutive forking rounds before it


def _run_before(round_forked: dict, k: int) -> int:
    """The number of consecutive tool rounds just before round k in which the task forked (the
    code's ``consecutive_branches`` of the task at round k)."""
    run = 0
    while round_forked.get(k - 1 - run, False):
        run += 1
    return run


def _policy_probs(policy, env, obs) -> np.ndarray:
    key = env.state_key() if policy.key == "state" else obs
    with torch.no_grad():
        return policy.probs([key])[0].numpy()


def tree_rollout(make_env, policy, seed: int, cfg: ARPOConfig, rng: np.random.Generator,
                 group_id: int = 0, max_turns: int | None = None, fork_fn=None) -> Tree:
    """One task's tree of ``cfg.group_size`` leaves (module docstring), played with ``policy``
    (``probs(keys)``, ``key``) on an environment that is deterministic given (seed, actions):
    a fork replays its prefix's actions after ``reset(seed)`` (the replayed tool calls are not
    paid again). ``info['tool_call']`` (else a valid ``info['tool']`` in ``env.tool_calls``) marks a
    paid tool call. ``fork_fn(key) -> probability`` (the policy's state key) replaces the fork rule
    at post-tool steps: an oracle trigger that knows where the decision lies (a positive control)."""
    M, Z = cfg.group_size, cfg.num_branches
    nodes = [0]  # the next node id

    def is_tool(env, info) -> bool:
        if "tool_call" not in info and hasattr(env, "tool_calls"):
            return info.get("tool") in env.tool_calls and bool(info.get("valid", True))
        return is_paid_tool_call(info)

    def new_path():
        env = make_env()
        obs = env.reset(seed=int(seed))
        ep = Episode.start(env, obs, group_id)
        return ep, [], [], [], 0, env

    def play(path, h_init, h_max, n_budget):
        """Finish a path (episode, node ids, tool-call flags and entropies of its steps, forks on
        its lineage, environment), forking where the score says so while
        ``n_budget['leaves'] + Z <= M`` (no forks when h_init is None). Returns the forks it
        spawned as (episode, turn, ids, tool flags, entropies, l)."""
        ep, ids, tools, ents, l, env = path
        spawned = []
        running = True
        cap = max_turns or getattr(env, "max_turns", None)
        while running and (cap is None or len(ep) < cap):
            p = _policy_probs(policy, env, ep.observations[-1])
            h = entropy(p)
            t = len(ep)
            after_tool = t > 0 and tools[-1]
            if (cfg.rollout != "global" and after_tool and h_init is not None
                    and n_budget["leaves"] + Z <= M):
                dh = entropy_change(h, h_init, h_max) if cfg.fork_rule == "entropy" else 0.0
                k = sum(tools)  # the tool round: tool responses in the prefix
                if cfg.rollout == "aepo":
                    run = _run_before(n_budget["round_forked"], k)
                    prob = aepo_branch_probability(dh, cfg.alpha, cfg.beta, cfg.penalty, run)
                else:
                    prob = branch_probability(dh, cfg.alpha, cfg.beta)
                key = env.state_key() if policy.key == "state" else ep.observations[-1]
                if fork_fn is not None:
                    prob = fork_fn(key)
                forked = bool(rng.random() < prob)
                rounds = n_budget["round_forked"]
                rounds[k] = rounds.get(k, False) or forked
                if forked:
                    n_budget["fork_keys"].append(key)
                    n_budget["leaves"] += Z
                    spawned += [(ep, t, ids[:t], tools[:t], ents[:t], l + 1)] * Z
                    n_budget["fork_depths"].append(t)
                    n_budget["fork_lineage"].append(l)
                    n_budget["fork_consecutive"].append(run if cfg.rollout == "aepo" else
                                                        _run_before(rounds, k))
                    l += 1
            a = int(rng.choice(len(p), p=p / p.sum()))
            running = record_step(ep, env, a)
            tools.append(is_tool(env, ep.infos[-1]))
            ents.append(h)
            ids.append(nodes[0])
            nodes[0] += 1
        return spawned

    def fork_path(parent, t, ids, tools, ents, l):
        env, ep = fork_episode(make_env, parent, t, seed)  # the prefix replayed, not paid again
        return ep, list(ids), list(tools), list(ents), l, env  # Z forks share one spawn record

    # the root's entropy (one probe of the policy, no environment step paid)
    env0 = make_env()
    obs0 = env0.reset(seed=int(seed))
    p0 = _policy_probs(policy, env0, obs0)
    h_root, h_max = entropy(p0), math.log(len(p0))
    n_global = cfg.num_global if cfg.rollout == "arpo" else M
    budget = {"leaves": 0, "fork_depths": [], "fork_lineage": [], "fork_keys": [],
              "round_forked": {}, "fork_consecutive": []}
    leaves = []  # the path of each finished leaf
    queue = []  # paths to play: ("global", None) or ("fork", (episode, turn, ids, tools, ents, l))
    if cfg.rollout == "aepo":  # pre-monitoring: the first global path (no forks) gives H_tool
        budget["leaves"] = 1
        path = new_path()
        play(path, None, h_max, budget)
        _, _, tools, ents, _, _ = path
        post = [h for k, h in enumerate(ents) if k > 0 and tools[k - 1]]
        h_tool = float(np.mean(post)) if post else h_root
        n_global = global_count(M, h_root, h_tool, cfg.kappa, h_max)
        leaves.append(path)
        queue += [("global", None)] * (n_global - 1)
    else:
        queue += [("global", None)] * n_global
    budget["leaves"] += len(queue)
    h_init = None if cfg.rollout == "global" else h_root
    while len(leaves) < M:
        if not queue:  # every path ended under budget: fill with global samples
            queue.append(("global", None))
            budget["leaves"] += 1
        kind, fork = queue.pop(0)
        path = new_path() if kind == "global" else fork_path(*fork)
        queue += [("fork", f) for f in play(path, h_init, h_max, budget)]
        leaves.append(path)
    episodes, node_ids = [], []
    for ep, ids, _, ents, _, _ in leaves:
        if len(ep.observations) > len(ep):  # stopped by the turn cap, not by the environment
            ep = truncate(ep, len(ep))
        ep.entropies = ents  # H(pi(.|k_t)) of each step, for the logs
        episodes.append(ep)
        node_ids.append(ids)
    tool_nodes = {n for _, ids, tools, _, _, _ in leaves for tool, n in zip(tools, ids) if tool}
    return Tree(episodes, node_ids, len(tool_nodes), len(budget["fork_depths"]),
                budget["fork_depths"], budget["fork_lineage"], n_global, budget["fork_keys"],
                budget["fork_consecutive"])


def post_tool_mask(ep) -> np.ndarray:
    """(T,) bool: the steps that follow a tool response (the previous step was a paid tool call)."""
    m = np.zeros(len(ep), dtype=bool)
    for t in range(1, len(ep)):
        info = ep.infos[t - 1]
        m[t] = bool(info.get("tool_call", False))
    return m


def tree_advantages(trees, cfg: ARPOConfig) -> list[np.ndarray]:
    """Per-step advantages of every leaf of every tree: leaf GRPO advantages, attributed
    (``cfg.attribution``), then AEPO's entropy weighting where ``cfg.gamma_h`` != 0 (each step's
    entropy z-scored over every step of the batch, ``entropy_aware_advantages``)."""
    out, ents = [], []
    for tree in trees:
        leaf = leaf_advantages([ep.ret for ep in tree.episodes])
        out += attribute(tree.node_ids, leaf, cfg.attribution)
        ents += [ep.entropies for ep in tree.episodes]
    if cfg.gamma_h != 0.0:
        out = entropy_aware_advantages(out, ents, cfg.gamma_h)
    return out


def train(make_env, policy, cfg: ARPOConfig, train_seeds, evaluate=None, logger=None,
          initial_eval: dict | None = None, on_step=None, fork_fn=None) -> list[dict]:
    """Tabular ARPO / AEPO / GRPO (``cfg.rollout``) on ``loop.run``: per update, ``num_prompts``
    trees (tasks drawn from ``train_seeds``), ``tree_advantages``, one ``agent_pg.update`` (PPO
    clip, turn-level mean over all leaves' steps). Stops after ``num_iters`` updates or once
    ``max_tool_calls`` tool calls were paid. Rows: iter, episodes, ``rollout/*`` (success, return,
    turns, tool_calls (this batch), forks, num_global, entropy_first, entropy_post_tool),
    ``charts/tool_calls`` (cumulative), ``losses/*``, ``eval/*`` (``evaluate(policy)`` at the
    start, every eval_every updates and after the last).
    """
    rng = np.random.default_rng(cfg.seed)
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    pg_cfg = agent_pg.AgentPGConfig(lr=cfg.lr, clip_eps=cfg.clip_eps, num_epochs=cfg.num_epochs)
    paid, n_eps = 0, 0

    def sample_fn(policy, it: int) -> agent_pg.EpisodeBatch:
        nonlocal paid, n_eps
        seeds = agent_pg.draw_seeds(train_seeds, rng, it, cfg.num_prompts)
        trees = [tree_rollout(make_env, policy, int(s), cfg, rng, group_id=g, fork_fn=fork_fn)
                 for g, s in enumerate(seeds)]
        episodes = [ep for t in trees for ep in t.episodes]
        batch_calls = sum(t.tool_calls for t in trees)
        paid += batch_calls
        n_eps += len(episodes)
        ents = np.concatenate([ep.entropies for ep in episodes if len(ep)])
        post = np.concatenate([post_tool_mask(ep) for ep in episodes if len(ep)])
        first = np.concatenate([np.arange(len(ep)) == 0 for ep in episodes if len(ep)])
        return agent_pg.EpisodeBatch(episodes, {
            "episodes": n_eps, **episode_stats(episodes, "rollout/"),
            "rollout/tool_calls": batch_calls, "charts/tool_calls": paid,
            "rollout/forks": float(np.mean([t.forks for t in trees])),
            "rollout/num_global": float(np.mean([t.num_global for t in trees])),
            "rollout/entropy_first": float(ents[first].mean()),
            "rollout/entropy_post_tool": float(ents[post].mean()) if post.any() else float("nan"),
        }, extra={"trees": trees})

    def update_fn(batch: agent_pg.EpisodeBatch, it: int) -> dict:
        adv = tree_advantages(batch.extra["trees"], cfg)
        return agent_pg.update(policy, optimizer, batch.episodes, adv, pg_cfg)

    def budget_spent(row: dict) -> bool:
        return cfg.max_tool_calls is not None and row["charts/tool_calls"] >= cfg.max_tool_calls

    return loop.run(policy, sample_fn, update_fn, cfg.num_iters, evaluate=evaluate,
                    eval_every=cfg.eval_every, initial_eval=initial_eval,
                    start={"episodes": 0, "charts/tool_calls": 0}, stop=budget_spent,
                    logger=logger, on_step=on_step, desc="arpo")


# --- the LM rung: entropy after tool responses, and tree rollouts by prefix replay -------------------
def is_paid_tool_call(info: dict) -> bool:
    """A step that executed a tool: ``info['tool_call']`` where the environment says so, else a
    valid call whose tool is not a reply to the user (answer, confirm)."""
    if "tool_call" in info:
        return bool(info["tool_call"])
    return bool(info.get("valid")) and info.get("tool") not in (None, "answer", "confirm")


def count_tool_calls(episodes) -> int:
    """The tool calls paid by independent episodes (every step counted)."""
    return sum(is_paid_tool_call(i) for ep in episodes for i in ep.infos)


def lm_turn_entropies(model, episodes, k: int = 4) -> list[np.ndarray]:
    """Per turn, the mean token entropy of the first ``k`` tokens of the LM's action (the paper
    reads the first k tokens after each tool response), (T_i,) per episode; one teacher-forced
    forward pass at temperature 1 (``rollout.episode_logps``)."""
    from agentrl_lib.rollout import episode_logps

    with torch.no_grad():
        _, ents, _ = episode_logps(model, episodes)  # (B, N)
    out = []
    for i, ep in enumerate(episodes):
        out.append(np.array([ents[i, s:min(e, s + k)].mean().item() for s, e in ep.turn_spans]))
    return out


def lm_tree_sampler(tokenizer, make_env, train_seeds, cfg, tree_cfg: ARPOConfig, k: int = 4,
                    system_prompt: str | None = None):
    """``sample(model, it=0) -> grpo.Batch``: ARPO's tree rollouts for the LM loop (``grpo.train``).

    Per task seed: ``tree_cfg.num_global`` (N) episodes by ``lm_rollout``; each post-tool turn's
    first-k-token entropy H_t (``lm_turn_entropies``) against the mean first-turn entropy H_init of
    the task's N episodes, dH_t = (H_t - H_init) / H_init (normalised by the start's entropy here:
    log V is far above a trained LM's token entropies; inferred); each post-tool turn is drawn to
    fork with probability clip(alpha + beta dH_t) (``branch_probability``; ``fork_rule='random'``:
    alpha); the drawn turns fork Z partial rollouts, best score first, while the task has leaves
    left of ``cfg.group_size`` (M); one level of forks (a fork does not fork again: simplified);
    leftover leaves are global episodes. A fork copies its parent's conversation up to the turn
    (tokens, masks and sampling log-probs), replays the parent's calls on a fresh environment
    (``reset(seed)``; the replayed calls are not paid) and continues with the LM
    (``rollout.fork_episode`` and ``rollout.lm_continue``, re-encoding the conversation each turn). Every leaf is a row of the task's
    group: GRPO on the leaves is ARPO's soft attribution. Metrics add ``rollout/tool_calls`` (the
    distinct calls paid), ``rollout/forks`` and ``rollout/leaves``. ``cfg.max_context`` caps the
    conversations as in ``grpo.episode_sampler``."""
    import random
    import time

    from agentrl_lib.algorithms.grpo import Batch
    from agentrl_lib.rollout import (fork_episode, lm_continue, lm_rollout, model_device,
                                     pad_episodes, token_generator)

    rng = random.Random(cfg.seed)
    made = []
    max_context = getattr(cfg, "max_context", None)
    M, N, Z = cfg.group_size, tree_cfg.num_global, tree_cfg.num_branches
    if not 1 <= N <= M:
        raise ValueError(f"num_global must be in 1..group_size, got {N}")

    def sample(model, it: int = 0) -> Batch:  # it: updates done (loop.run); unused
        t0 = time.perf_counter()
        if not made:
            made.append(token_generator(model, cfg.seed))
        gen = made[0]
        seeds = rng.sample(list(train_seeds), cfg.num_prompts)
        eps = lm_rollout(model, tokenizer, make_env, seeds, N, cfg.max_turns, cfg.max_new_tokens,
                         cfg.temperature, gen, system_prompt, max_context=max_context)
        h = lm_turn_entropies(model, eps, k)
        paid = count_tool_calls(eps)
        forks, extra = [], []
        for g, seed in enumerate(seeds):
            members = [i for i, ep in enumerate(eps) if ep.group_id == g]
            h_init = float(np.mean([h[i][0] for i in members if len(h[i])]))
            cands = []
            for i in members:
                for t in range(1, len(eps[i])):
                    if is_paid_tool_call(eps[i].infos[t - 1]):
                        dh = (h[i][t] - h_init) / max(h_init, 1e-6)
                        dh = dh if tree_cfg.fork_rule == "entropy" else 0.0
                        score = branch_probability(dh, tree_cfg.alpha, tree_cfg.beta)
                        if rng.random() < score:
                            cands.append((score, i, t))
            cands.sort(key=lambda c: -c[0])
            room = M - N
            for _, i, t in cands:
                if room < Z:
                    break
                forks.append((g, seed, i, t))
                room -= Z
            extra += [(g, seed)] * room
        new = []
        by_t = defaultdict(list)
        for g, seed, i, t in forks:
            by_t[t] += [(g, seed, i)] * Z
        for t, items in sorted(by_t.items()):
            envs, branch = zip(*[fork_episode(make_env, eps[i], t, seed, g) for g, seed, i in items])
            branch = list(branch)
            lm_continue(model, tokenizer, list(envs), branch, cfg.max_turns - t, cfg.max_new_tokens,
                        cfg.temperature, gen, system_prompt, max_context=max_context)
            paid += sum(is_paid_tool_call(info) for ep in branch for info in ep.infos[t:])
            new += branch
        if extra:
            more = lm_rollout(model, tokenizer, make_env, [s for _, s in extra], 1, cfg.max_turns,
                              cfg.max_new_tokens, cfg.temperature, gen, system_prompt,
                              max_context=max_context)
            for ep, (g, _) in zip(more, extra):
                ep.group_id = g
            paid += count_tool_calls(more)
            new += more
        leaves = sorted(eps + new, key=lambda ep: ep.group_id)
        t_gen = time.perf_counter() - t0
        device = model_device(model)
        seqs = pad_episodes(leaves, tokenizer.pad_token_id, device)
        returns = torch.tensor([ep.ret for ep in leaves], dtype=torch.float32, device=device)
        return Batch(seqs, returns, {"rollout/reward": float(np.mean([ep.ret for ep in leaves])),
                                     **episode_stats(leaves, "rollout/"),
                                     "rollout/tool_calls": paid, "rollout/forks": len(forks),
                                     "rollout/leaves": len(leaves), "time/gen_s": t_gen},
                     episodes=leaves)
    return sample
