"""TreePS-RAG: tree rollouts by prefix replay and Monte-Carlo process advantages from the tree.

Zhang, Li, Li, Li, Luo, Wu, Glass, Meng (2026), "TreePS-RAG: Tree-based Process Supervision for
Reinforcement Learning in Agentic RAG", arXiv:2601.06922. An agentic-RAG rollout is a path in a
tree whose nodes are steps (a reasoning segment, a tool call, its observation); the answer ends a
leaf. The utility of a node is the Monte-Carlo mean of the outcome rewards of the leaves below it,
and a step's *process advantage* is how much it moved that value, from outcome rewards alone.

**The tree** (``tree_rollout``). A node is identified by its *prefix*: the group (one task) and the
action texts taken from the root, a_0 .. a_{t-1}. Our environments are deterministic given
(task seed, actions) (``KGSearchEnv``, ``KGMenuEnv``: search_other's random name is seeded by
(seed, turn)), so a node is restored by ``reset(seed)`` and replaying its prefix: no deep copy of an
environment. Per group of ``num_leaves`` leaves: ``num_leaves // branch_factor ** len(branch_depths)``
root rollouts are sampled in full; then at each depth d of ``branch_depths`` (ascending), every
leaf that acted at turn d gets ``branch_factor - 1`` siblings that replay its first d actions and
continue with fresh samples from the policy; a group whose leaves ended before a branch depth is
filled up to ``num_leaves`` with fresh root rollouts. So every group has exactly ``num_leaves``
leaves (the budget GRPO spends as ``group_size``), and the shared prefixes are tool calls not paid
twice (``TreeBatch.replayed``).

**The values and the advantage** (``node_values``, ``process_advantages``). With R_j the return of
leaf j and L(n) the leaves whose action sequence starts with node n's prefix,

    V(n) = mean_{j in L(n)} R_j,        A_{i,t} = (V(n_{i,t+1}) - V(n_{i,t})) / (sigma_g + eps),

where n_{i,t} is leaf i's node before turn t (n_{i,0} the root: V = the group mean) and sigma_g the
std (ddof 1) of the group's leaf returns (``norm_adv=False``: no division). The sum over a leaf's
turns telescopes to (R_i - mean_g R) / (sigma_g + eps): GRPO's outcome advantage, redistributed
over the steps that earned it. A group of one or of equal returns gets 0 everywhere (``credit``'s
convention). Prefixes can coincide in i.i.d. groups too (a menu policy often repeats its first
calls; an LM its first search), so the same estimator runs on GRPO's own groups (the LM rung).

**Inferred** (the paper's code was not available to us): V(child) - V(parent) as the process
advantage, its normalisation by the group's leaf std, the tree schedule (fixed branch depths and
factor, no similarity pruning of siblings), the fill with fresh roots, and the node key (exact
action text).

``train`` is ``agent_pg.train``'s loop with the sampler (``'tree'`` or ``'iid'``) and the advantage
(``'process'`` or ``'outcome'``) chosen by strings; with ``'iid'`` + ``'outcome'`` it is
``agent_pg.train(estimator='grpo')`` step for step (tested).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import torch

from agentrl_lib.algorithms import agent_pg, credit, loop
from agentrl_lib.algorithms.agent_pg import AgentPGConfig
from agentrl_lib.rollout import Episode, episode_stats, play_episodes

SAMPLERS = ("tree", "iid")
ADVANTAGES = ("process", "outcome")
FORMS = ("local", "global_local")


@dataclass
class TreeBatch:
    episodes: list  # (B,) leaf episodes; group g = the leaves of task seeds[g]
    replayed: list  # (B,) turns of each leaf replayed from an existing prefix (not new tool calls)

    @property
    def new_turns(self) -> int:
        """Tool calls actually made: every leaf's turns minus its replayed prefix."""
        return int(sum(len(ep) for ep in self.episodes) - sum(self.replayed))


def _play_jobs(make_env, policy, jobs, max_turns: int | None) -> list[Episode]:
    """One episode per job (group_id, seed, prefix actions): ``play_episodes`` from the replayed
    prefix, in the group of the job."""
    episodes = play_episodes(make_env, policy, [s for _, s, _ in jobs], 1, max_turns,
                             prefixes=[p for _, _, p in jobs])
    for (gid, _, _), ep in zip(jobs, episodes):
        ep.group_id = gid
    return episodes


def _prefix(ep: Episode, d: int) -> list:
    """The first ``d`` actions of ``ep`` as they were given (indices where there are any)."""
    return [i if i is not None else a for i, a in zip(ep.action_ids[:d], ep.actions[:d])]


def tree_rollout(make_env, policy, seeds: list[int], num_leaves: int, branch_depths=(1,),
                 branch_factor: int = 2, max_turns: int | None = None) -> TreeBatch:
    """``len(seeds)`` groups of exactly ``num_leaves`` leaves each, grown as a tree by prefix
    replay (module docstring): roots, then ``branch_factor - 1`` siblings of every leaf that acted
    at each depth of ``branch_depths``, then fresh roots up to the budget. Leaves are ordered
    group by group. ``policy`` and ``max_turns`` as in ``rollout.play_episodes``."""
    depths = tuple(int(d) for d in branch_depths)
    if num_leaves < 1 or branch_factor < 1:
        raise ValueError(f"num_leaves and branch_factor must be >= 1, got {num_leaves}, {branch_factor}")
    if any(d < 1 for d in depths) or list(depths) != sorted(set(depths)):
        raise ValueError(f"branch_depths must be distinct positive depths, ascending; got {branch_depths}")
    roots = max(1, num_leaves // branch_factor ** len(depths))
    root_jobs = [(g, s, []) for g, s in enumerate(seeds) for _ in range(roots)]
    groups = defaultdict(list)
    for (g, _, _), ep in zip(root_jobs, _play_jobs(make_env, policy, root_jobs, max_turns)):
        groups[g].append(ep)
    replayed = {g: [0] * roots for g in range(len(seeds))}
    for d in depths:
        jobs, owners = [], []
        for g, s in enumerate(seeds):
            for ep in groups[g]:
                room = num_leaves - len(groups[g]) - sum(o == g for o in owners)
                if len(ep) > d and room > 0:
                    n = min(branch_factor - 1, room)
                    jobs += [(g, s, _prefix(ep, d))] * n
                    owners += [g] * n
        for g, ep in zip(owners, _play_jobs(make_env, policy, jobs, max_turns)):
            groups[g].append(ep)
            replayed[g].append(d)
    fill = [(g, s, []) for g, s in enumerate(seeds) for _ in range(num_leaves - len(groups[g]))]
    for (g, _, _), ep in zip(fill, _play_jobs(make_env, policy, fill, max_turns)):
        groups[g].append(ep)
        replayed[g].append(0)
    episodes = [ep for g in range(len(seeds)) for ep in groups[g]]
    return TreeBatch(episodes, [r for g in range(len(seeds)) for r in replayed[g]])


def node_values(episodes) -> dict:
    """V(n) = mean return of the leaves below node n, for every node of every group's tree:
    {(group_id, prefix of action texts): V}; the root of group g is (g, ())."""
    leaves = defaultdict(list)
    for ep in episodes:
        acts = tuple(ep.actions)
        for t in range(len(acts) + 1):
            leaves[ep.group_id, acts[:t]].append(ep.ret)
    return {k: float(np.mean(v)) for k, v in leaves.items()}


def process_advantages(episodes, norm_adv: bool = True, form: str = "local", ddof: int = 1,
                       eps: float = 1e-4) -> list[np.ndarray]:
    """TreePS-RAG's process advantage, one (T_i,) array per episode; 0 in a group of one or of
    equal returns. ``form='local'``: A_{i,t} = (V(n_{i,t+1}) - V(n_{i,t})) / (sigma_g + eps)
    (module docstring). ``form='global_local'``: TreeRL's sum of a global and a local term (Hou et
    al. 2025, arXiv:2506.11902; without its 1/sqrt(|L(n)|) weight),
    A_{i,t} = ((V(n_{i,t+1}) - V(root)) + (V(n_{i,t+1}) - V(n_{i,t}))) / (sigma_g + eps):
    on a path no other leaf shares, the global term is GRPO's advantage on every turn."""
    if form not in FORMS:
        raise ValueError(f"form must be one of {FORMS}, got {form!r}")
    values = node_values(episodes)
    rets = {g: np.array([episodes[i].ret for i in idx])
            for g, idx in credit.groups_of(episodes).items()}
    out = []
    for ep in episodes:
        r = rets[ep.group_id]
        if len(r) < 2 or np.all(r == r[0]):
            out.append(np.zeros(len(ep)))
            continue
        scale = (r.std(ddof=ddof) + eps) if norm_adv else 1.0
        acts = tuple(ep.actions)
        v = np.array([values[ep.group_id, acts[:t]] for t in range(len(acts) + 1)])  # (T+1,)
        a = v[1:] - v[:-1]  # (T,) local: the step's change of value
        if form == "global_local":
            a = a + (v[1:] - v[0])
        out.append(a / scale)
    return out


def shared_share(episodes) -> float:
    """The fraction of turns whose node after the turn (the prefix through it) is shared by at
    least two leaves of the group: only there can a process advantage differ from the leaf's
    own end-of-path credit."""
    count = defaultdict(int)
    for ep in episodes:
        for t in range(1, len(ep) + 1):
            count[ep.group_id, tuple(ep.actions[:t])] += 1
    turns = sum(len(ep) for ep in episodes)
    shared = sum(count[ep.group_id, tuple(ep.actions[:t])] >= 2
                 for ep in episodes for t in range(1, len(ep) + 1))
    return shared / turns if turns else 0.0


@dataclass
class TreePSConfig:
    sampler: str = "tree"
    """'tree' (``tree_rollout``) or 'iid' (``play_episodes``: ``num_leaves`` independent episodes)"""
    advantage: str = "process"
    """'process' (``process_advantages``) or 'outcome' (GRPO's, broadcast to every turn)"""
    form: str = "local"
    """process advantage's form: 'local' or 'global_local' (``process_advantages``)"""
    num_leaves: int = 8
    """leaves per task: the tree's budget, GRPO's group size"""
    branch_depths: tuple = (1, 2)
    """turns after which every leaf branches ('tree')"""
    branch_factor: int = 2
    """children per branching ('tree'): the original continuation plus branch_factor - 1"""

    def __post_init__(self):
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {self.sampler!r}")
        if self.form not in FORMS:
            raise ValueError(f"form must be one of {FORMS}, got {self.form!r}")
        if self.advantage not in ADVANTAGES:
            raise ValueError(f"advantage must be one of {ADVANTAGES}, got {self.advantage!r}")


def sample(make_env, policy, seeds, tree: TreePSConfig, max_turns=None) -> TreeBatch:
    """One batch of ``tree.sampler``: a tree per seed, or ``num_leaves`` i.i.d. episodes per seed."""
    if tree.sampler == "tree":
        return tree_rollout(make_env, policy, seeds, tree.num_leaves, tree.branch_depths,
                            tree.branch_factor, max_turns)
    eps = play_episodes(make_env, policy, list(seeds), tree.num_leaves, max_turns)
    return TreeBatch(eps, [0] * len(eps))


def advantages(episodes, tree: TreePSConfig, cfg: AgentPGConfig) -> list[np.ndarray]:
    """Turn advantages of ``tree.advantage``."""
    if tree.advantage == "process":
        return process_advantages(episodes, norm_adv=cfg.norm_adv, form=tree.form)
    return credit.grpo_broadcast(episodes, norm_adv=cfg.norm_adv)


def train(make_env, policy, cfg: AgentPGConfig, tree: TreePSConfig, train_seeds, evaluate=None,
          logger=None, initial_eval: dict | None = None, on_step=None) -> list[dict]:
    """``agent_pg.train``'s frame (``loop.run``, same task draws, same ``agent_pg.update``) with
    ``tree``'s sampler and advantage; ``cfg.group_size`` is ignored (``tree.num_leaves`` leaves per
    task). Rows add ``tool_calls`` (so far), ``rollout/new_turns`` (tool calls made per leaf,
    replays excluded) and ``rollout/shared`` (``shared_share``)."""
    rng = np.random.default_rng(cfg.seed)
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.lr)
    num_episodes, num_calls = 0, 0

    def sample_fn(policy, it: int) -> agent_pg.EpisodeBatch:
        nonlocal num_episodes, num_calls
        seeds = agent_pg.draw_seeds(train_seeds, rng, it, cfg.num_prompts)
        batch = sample(make_env, policy.act, list(seeds), tree, cfg.max_turns_at(it))
        episodes = batch.episodes
        num_episodes += len(episodes)
        num_calls += batch.new_turns
        return agent_pg.EpisodeBatch(episodes, {
            "episodes": num_episodes, "tool_calls": num_calls, **episode_stats(episodes, "rollout/"),
            "rollout/new_turns": batch.new_turns / len(episodes),
            "rollout/shared": shared_share(episodes)})

    def update_fn(batch: agent_pg.EpisodeBatch, it: int) -> dict:
        adv = advantages(batch.episodes, tree, cfg)
        return {"rollout/abs_adv": float(np.mean(np.abs(np.concatenate(adv)))),
                **agent_pg.update(policy, optimizer, batch.episodes, adv, cfg, None, it)}

    return loop.run(policy, sample_fn, update_fn, cfg.num_iters, evaluate=evaluate,
                    eval_every=cfg.eval_every, initial_eval=initial_eval,
                    start={"episodes": 0, "tool_calls": 0}, logger=logger, on_step=on_step,
                    desc="treeps")
