"""Dr. MAS: agent-wise advantage normalisation for multi-agent group RL (Feng, Zheng, He, Zhang, An
2026, "Dr. MAS: Stable Reinforcement Learning for Multi-Agent LLM Systems", arXiv:2602.08847).

Setting: K agents (roles) act in one episode; every turn is one agent's *row* (one generation, as
a row of the authors' verl batch). Episodes come in groups of G that share a task (GRPO's groups).

**The released form** (``reward='team'``, the default; langfengQ/DrMAS @19c632b,
``agent_system/multi_turn_rollout/rollout_loop.py`` and ``agent_system/reward_manager/episode.py``
for the reward, ``verl/trainer/ppo/core_algos.py:compute_grpo_outcome_advantage`` for the
advantage, ported as ``released_grpo_advantage``): every row of episode i scores the episode's
accumulated environment reward R_i, the *team* reward, minus ``invalid_penalty_coef`` if that
row's action was invalid (``ray_trainer.apply_invalid_action_penalty``). Then

- ``normalisation='global'`` (GRPO applied to the whole system, ``group_by_agent_id=False``): the
  rows of one trajectory are averaged into one score, one score per trajectory is pooled per group,
  and every row of trajectory i gets A_i = (mean_rows(i) - mu_g) / (sigma_g + 1e-6): all agents of
  an episode share one advantage;
- ``normalisation='agent'`` (Dr. MAS, ``group_by_agent_id=True``): the pool is (group, agent) and
  every row is one sample, A_row = (score_row - mu_{g,k}) / (sigma_{g,k} + 1e-6), mu_{g,k},
  sigma_{g,k} over agent k's rows in the group (an agent that acts more often weighs its
  trajectories more).

torch.std (ddof 1), eps 1e-6, and a pool of one gets mean 0, std 1 (its advantage is the raw score).

**Our earlier form** (``reward='agent'``, a variant): agent k's *own* reward in episode i,
R_{i,k} (the sum of its turn rewards: evidence for a searcher, correctness for an answerer), on a
sample per turn (``unit='turn'``) or per (episode, agent) (``unit='episode'``); 'global' pools
every agent's samples in the group, each keeping its own agent's reward,
A_{i,k} = (R_{i,k} - mu_g) / (sigma_g + eps); 'agent' pools agent k's samples. std with ddof=1,
eps=1e-4, zero advantages for a pool of one or of all-equal rewards (``credit.group_normalise``).
It builds a reward-scale gap between the agents that the released setting does not have, and so
shows the mechanism below at full size.

Why it matters (the paper's argument, written here in the form we check exactly): with population
statistics, the mean squared advantage agent k receives under a global baseline is
E_k[A^2] = (sigma_k^2 + (mu_k - mu)^2) / sigma^2 (``global_second_moment``), against 1 under
agent-wise normalisation. An agent whose rewards sit far from the pooled mean, or whose spread is large or
small against the pooled spread, receives advantages, and so policy gradients, of the wrong scale:
the gradient-norm spikes Dr. MAS removes. ``norm_adv=False`` centres without dividing (Dr. GRPO).

The loop ``train`` gives each agent its OWN policy and optimiser (separate parameters, as the
paper's non-shared setting) and logs each agent's gradient norm before its step
(``losses/grad_norm_<role>``); ``evaluate_at_k`` reports avg@k and pass@k.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import torch

from agentrl_lib.algorithms import agent_pg, loop
from agentrl_lib.algorithms.credit import groups_of, normalise_within
from agentrl_lib.rollout import Episode, play_episodes
from agentrl_lib.utils import optimizer_step

NORMALISATIONS = ("agent", "global")
REWARDS = ("team", "agent")


def turn_roles(ep, role_of=None) -> list:
    """The role that acted at each turn: ``role_of(ep, t)``, default the state key's first field."""
    role_of = role_of or (lambda e, t: e.state_keys[t][0])
    return [role_of(ep, t) for t in range(len(ep))]


def agent_rewards(episodes, roles, role_of=None) -> np.ndarray:
    """R_{i,k}: the sum of agent k's turn rewards in episode i, (B, K); NaN where k never acted."""
    out = np.full((len(episodes), len(roles)), np.nan)  # (B, K)
    for i, ep in enumerate(episodes):
        for r, role in zip(ep.rewards, turn_roles(ep, role_of)):
            k = roles.index(role)
            out[i, k] = (0.0 if np.isnan(out[i, k]) else out[i, k]) + float(r)
    return out


def normalise_rewards(rewards, group_ids, agent_ids, normalisation: str = "agent",
                      norm_adv: bool = True, ddof: int = 1, eps: float = 1e-4) -> np.ndarray:
    """A of every sample, (N,) -> (N,): sample n has reward R_n, group g_n and agent k_n; each group
    is normalised as one pool ('global') or per agent ('agent', Dr. MAS)."""
    if normalisation not in NORMALISATIONS:
        raise ValueError(f"normalisation must be one of {NORMALISATIONS}, got {normalisation!r}")
    rewards = np.asarray(rewards, dtype=np.float64)  # (N,)
    group_ids, agent_ids = np.asarray(group_ids), np.asarray(agent_ids)
    if rewards.ndim != 1 or group_ids.shape != rewards.shape or agent_ids.shape != rewards.shape:
        raise ValueError("rewards, group_ids and agent_ids must be (N,) each, got shapes "
                         f"{rewards.shape}, {group_ids.shape}, {agent_ids.shape}")
    if np.isnan(rewards).any():
        raise ValueError("rewards contain NaN")
    pools = defaultdict(list)
    for n, (g, k) in enumerate(zip(group_ids.tolist(), agent_ids.tolist())):
        pools[(g,) if normalisation == "global" else (g, k)].append(n)
    return normalise_within(rewards, pools.values(), norm_adv, ddof, eps)  # (N,)


def released_grpo_advantage(scores, index, traj_index, group_by_agent_id: bool = False,
                            norm_adv: bool = True, eps: float = 1e-6) -> np.ndarray:
    """verl's ``compute_grpo_outcome_advantage`` as released with Dr. MAS (langfengQ/DrMAS
    @19c632b, ``verl/trainer/ppo/core_algos.py``), on one score per row: (N,) -> (N,).

    ``index[n]`` is row n's pool key (the prompt uid; with ``group_by_agent_id`` the caller makes
    it (uid, agent id), as ``ray_trainer.compute_advantage``), ``traj_index[n]`` its trajectory.
    ``group_by_agent_id=False``: the rows of one (pool, trajectory) are averaged, that average
    replaces each of their scores and is pooled once per trajectory; True: every row is pooled.
    Per pool: mean and std (ddof 1, torch.std); a pool of one gets mean 0 and std 1. Then
    (score - mean) / (std + eps), or score - mean when ``norm_adv`` is False. Float64 here (the
    released code runs in float32)."""
    scores = np.asarray(scores, dtype=np.float64).copy()  # (N,)
    if scores.ndim != 1 or len(index) != len(scores) or len(traj_index) != len(scores):
        raise ValueError("scores, index and traj_index must be (N,) each")
    rows_of = defaultdict(list)  # (pool, trajectory) -> its rows, in order of first appearance
    for n, key in enumerate(zip(index, traj_index)):
        rows_of[key].append(n)
    pool = defaultdict(list)
    if group_by_agent_id:
        for (idx, _), rows in rows_of.items():
            pool[idx].extend(scores[rows].tolist())
    else:
        for (idx, _), rows in rows_of.items():
            avg = scores[rows].mean()
            scores[rows] = avg
            pool[idx].append(avg)
    stats = {idx: (0.0, 1.0) if len(x) == 1 else (float(np.mean(x)), float(np.std(x, ddof=1)))
             for idx, x in pool.items()}
    mean = np.array([stats[idx][0] for idx in index], dtype=np.float64)  # (N,)
    std = np.array([stats[idx][1] for idx in index], dtype=np.float64)  # (N,)
    return (scores - mean) / (std + eps) if norm_adv else scores - mean


def row_scores(episodes, invalid_penalty_coef: float = 0.01) -> list[np.ndarray]:
    """The released reward of every turn (row), (T_i,) per episode: the episode's accumulated
    environment reward R_i (``rollout_loop.gather_rollout_data`` copies ``episode_rewards`` to
    every active row; ``EpisodeRewardManager`` puts it on the row's last token) minus
    ``invalid_penalty_coef`` where the turn's action was invalid (``apply_invalid_action_penalty``;
    0.01 in ``examples/drmas_trainer/run_search.sh``)."""
    return [float(sum(ep.rewards)) - invalid_penalty_coef
            * (1.0 - np.asarray(ep.valid, dtype=np.float64)) for ep in episodes]


def team_advantages(episodes, roles, normalisation: str = "agent", unit: str = "turn",
                    norm_adv: bool = True, ddof: int = 1, eps: float | None = None,
                    role_of=None, reward: str = "team",
                    invalid_penalty_coef: float = 0.01) -> list[np.ndarray]:
    """Per-turn advantages, (T_i,) per episode. A ``credit_fn`` for ``grpo.train`` and the
    advantage of ``train``.

    ``reward='team'`` (the released form): ``row_scores`` through ``released_grpo_advantage``,
    one row per turn, pooled per group ('global', trajectories averaged) or per (group, agent)
    ('agent'); eps default 1e-6; ``unit`` must be 'turn' and ``ddof`` 1 (the released ones).
    ``reward='agent'`` (our earlier form, a variant): the agents' own rewards R_{i,k}
    (``agent_rewards``); ``unit='turn'``: every turn of agent k in episode i is one sample with
    reward R_{i,k} (an agent that acts more often weighs more in a global pool);
    ``unit='episode'``: one sample per (episode, agent), broadcast to that agent's turns; eps
    default 1e-4."""
    if unit not in ("turn", "episode"):
        raise ValueError(f"unit must be 'turn' or 'episode', got {unit!r}")
    if reward not in REWARDS:
        raise ValueError(f"reward must be one of {REWARDS}, got {reward!r}")
    if normalisation not in NORMALISATIONS:
        raise ValueError(f"normalisation must be one of {NORMALISATIONS}, got {normalisation!r}")
    who = [[roles.index(w) for w in turn_roles(ep, role_of)] for ep in episodes]
    if reward == "team":
        if unit != "turn" or ddof != 1:
            raise ValueError("reward='team' is the released form: one row per turn, ddof 1")
        scores = row_scores(episodes, invalid_penalty_coef)
        g = [ep.group_id for ep, ks in zip(episodes, who) for _ in ks]
        k = [kk for ks in who for kk in ks]
        index = list(zip(g, k)) if normalisation == "agent" else g
        traj = [i for i, ks in enumerate(who) for _ in ks]
        a = released_grpo_advantage(np.concatenate(scores) if scores else np.zeros(0), index,
                                    traj, normalisation == "agent", norm_adv,
                                    1e-6 if eps is None else eps)
        cuts = np.cumsum([len(ks) for ks in who])[:-1]
        return [np.asarray(x, dtype=np.float64) for x in np.split(a, cuts)] if who else []
    eps = 1e-4 if eps is None else eps
    R = agent_rewards(episodes, roles, role_of)  # (B, K)
    if unit == "turn":
        r = [R[i, k] for i, ks in enumerate(who) for k in ks]
        g = [ep.group_id for ep, ks in zip(episodes, who) for _ in ks]
        a = normalise_rewards(r, g, [k for ks in who for k in ks], normalisation, norm_adv,
                              ddof, eps)
        cuts = np.cumsum([len(ks) for ks in who])[:-1]
        return [np.asarray(x, dtype=np.float64) for x in np.split(a, cuts)] if who else []
    i_s, k_s = np.nonzero(~np.isnan(R))
    a = normalise_rewards(R[i_s, k_s], [episodes[i].group_id for i in i_s], k_s, normalisation,
                          norm_adv, ddof, eps)
    A = np.zeros_like(R)
    A[i_s, k_s] = a
    return [np.array([A[i, k] for k in ks]) for i, ks in enumerate(who)]


def global_second_moment(r_k: np.ndarray, r_all: np.ndarray) -> float:
    """E_k[A^2] under the global baseline with population statistics:
    (sigma_k^2 + (mu_k - mu)^2) / sigma^2, where (mu_k, sigma_k) are agent k's and (mu, sigma) the
    pool's (every agent's samples). 1 for every agent under agent-wise normalisation."""
    r_k, r_all = np.asarray(r_k, dtype=np.float64), np.asarray(r_all, dtype=np.float64)
    if r_all.std() == 0:
        raise ValueError("the pooled rewards are all equal: the global advantage is undefined")
    return float((r_k.var() + (r_k.mean() - r_all.mean()) ** 2) / r_all.var())


def avg_pass_at_k(success) -> tuple[float, float]:
    """(avg@k, pass@k) of a (num_tasks, k) 0/1 table: the mean success of all k samples, and the
    share of tasks with at least one success among its k samples."""
    s = np.asarray(success, dtype=np.float64)
    if s.ndim != 2 or s.shape[1] < 1:
        raise ValueError(f"success must be (num_tasks, k) with k >= 1, got shape {s.shape}")
    return float(s.mean()), float((s.max(axis=1) > 0).mean())


def split_roles(episodes, roles, offsets: dict, role_of=None) -> dict:
    """{role: [Episode, ...]}: each episode cut to that role's turns (state keys, rewards, actions),
    its action ids shifted to the role's own menu (``offsets[role]``: its first global index)."""
    out = {role: [] for role in roles}
    for ep in episodes:
        who = turn_roles(ep, role_of)
        for role in roles:
            ts = [t for t, w in enumerate(who) if w == role]
            out[role].append(Episode(
                observations=[ep.observations[t] for t in ts], actions=[ep.actions[t] for t in ts],
                rewards=[ep.rewards[t] for t in ts], state_keys=[ep.state_keys[t] for t in ts],
                valid=[ep.valid[t] for t in ts], infos=[ep.infos[t] for t in ts],
                group_id=ep.group_id, task=ep.task,
                action_ids=[ep.action_ids[t] - offsets[role] for t in ts]))
    return out


def team_act(policies: dict, greedy: bool = False):
    """A ``play_episodes`` policy for a team env: each environment's current ``role`` acts with its
    own policy (``policies[role]``, over ``env.actions_of(role)``); returns global action ids."""
    def act(envs, observations):
        out = [None] * len(envs)
        for role, pol in policies.items():
            idx = [j for j, e in enumerate(envs) if e.role == role]
            if not idx:
                continue
            sub = [envs[j] for j in idx]
            if greedy:
                with torch.no_grad():
                    a = pol.probs([e.state_key() for e in sub]).argmax(-1).tolist()
            else:
                a = pol.act(sub, [observations[j] for j in idx])
            for j, aj in zip(idx, a):
                out[j] = int(aj) + envs[j].action_offset(role)
        return out
    return act


@dataclass
class DrMASConfig:
    num_iters: int = 50
    """rollout batches"""
    num_prompts: int = 8
    """groups per batch (task seeds)"""
    group_size: int = 8
    """episodes per group (same task)"""
    lr: float = 0.1
    """Adam learning rate of every agent's policy"""
    normalisation: str = "agent"
    """'agent' (Dr. MAS) or 'global' (one GRPO baseline for the whole system)"""
    reward: str = "team"
    """'team' (the released form: every row scores the episode's reward) or 'agent' (ours: each
    agent its own reward; a variant)"""
    invalid_penalty_coef: float = 0.01
    """subtracted from an invalid turn's score under reward='team' (run_search.sh: 0.01)"""
    unit: str = "turn"
    """reward='agent' only: one normalisation sample is an agent's 'turn' or its 'episode'"""
    norm_adv: bool = True
    """divide by the std (GRPO); False = mean-only"""
    eval_every: int = 10
    """updates between evaluations (``loop.run``)"""
    seed: int = 0
    """seed of the task draws (each policy has its own rng)"""

    def __post_init__(self):
        if self.normalisation not in NORMALISATIONS:
            raise ValueError(f"normalisation must be one of {NORMALISATIONS}, "
                             f"got {self.normalisation!r}")
        if self.reward not in REWARDS:
            raise ValueError(f"reward must be one of {REWARDS}, got {self.reward!r}")


def agent_loss(policy, episodes, advantages) -> torch.Tensor:
    """L_k = -mean over agent k's turns of A_t log pi_k(a_t | s_t) (REINFORCE on the advantage)."""
    adv = torch.as_tensor(np.concatenate([np.asarray(a, dtype=np.float64) for a in advantages]
                                         or [np.zeros(0)]), dtype=torch.float64)  # (N,)
    if adv.numel() == 0:
        return torch.zeros((), dtype=torch.float64, requires_grad=True)
    return -(adv * policy.episode_logps(episodes)).mean()


def train(make_env, policies: dict, cfg: DrMASConfig, train_seeds, evaluate=None, logger=None,
          initial_eval: dict | None = None, on_step=None) -> list[dict]:
    """Train one policy per role for ``cfg.num_iters`` batches on ``loop.run``. Per iteration:
    play groups with ``team_act``, advantages with ``team_advantages`` (``cfg.normalisation``,
    ``cfg.reward``), one Adam step per agent on its own turns. Rows: ``rollout/success``, ``rollout/reward_<role>``,
    ``rollout/abs_adv_<role>``, ``rollout/mean_adv_<role>`` (the sign of a misfit baseline),
    ``losses/grad_norm_<role>`` (before the step), ``losses/loss_<role>``, ``eval/*``
    (``evaluate(policies)``)."""
    roles = tuple(policies)
    probe = make_env()
    offsets = {role: probe.action_offset(role) for role in roles}
    rng = np.random.default_rng(cfg.seed)
    optims = {role: torch.optim.Adam(p.parameters(), lr=cfg.lr) for role, p in policies.items()}

    def sample_fn(policies, it: int) -> agent_pg.EpisodeBatch:
        seeds = agent_pg.draw_seeds(train_seeds, rng, it, cfg.num_prompts)
        episodes = play_episodes(make_env, team_act(policies), list(seeds), cfg.group_size)
        return agent_pg.EpisodeBatch(episodes, {
            "episodes": (it + 1) * len(episodes),
            "rollout/success": float(np.mean([ep.success for ep in episodes]))})

    def update_fn(batch: agent_pg.EpisodeBatch, it: int) -> dict:
        episodes = batch.episodes
        adv = team_advantages(episodes, roles, cfg.normalisation, cfg.unit, cfg.norm_adv,
                              reward=cfg.reward, invalid_penalty_coef=cfg.invalid_penalty_coef)
        split = split_roles(episodes, roles, offsets)
        R = agent_rewards(episodes, roles)  # (B, K)
        row = {}
        for k, role in enumerate(roles):
            who = [np.array(turn_roles(ep)) == role for ep in episodes]
            adv_k = [a[m] for a, m in zip(adv, who)]
            loss = agent_loss(policies[role], split[role], adv_k)
            row[f"losses/grad_norm_{role}"] = optimizer_step(optims[role], loss)
            row[f"losses/loss_{role}"] = float(loss.detach())
            row[f"rollout/reward_{role}"] = float(np.nanmean(R[:, k]))
            flat = np.concatenate(adv_k) if adv_k else np.zeros(0)
            row[f"rollout/abs_adv_{role}"] = float(np.abs(flat).mean()) if flat.size else 0.0
            row[f"rollout/mean_adv_{role}"] = float(flat.mean()) if flat.size else 0.0
        return row

    return loop.run(policies, sample_fn, update_fn, cfg.num_iters, evaluate=evaluate,
                    eval_every=cfg.eval_every, initial_eval=initial_eval, start={"episodes": 0},
                    logger=logger, on_step=on_step, desc="dr_mas")


def evaluate_at_k(make_env, policies: dict, seeds, k: int = 8) -> dict:
    """avg@k and pass@k (k sampled team episodes per task seed), the greedy team's success, and the
    mean per-agent rewards of the sampled episodes."""
    roles = tuple(policies)
    episodes = play_episodes(make_env, team_act(policies), list(seeds), k)
    by_group = {g: [float(episodes[i].success) for i in idx]
                for g, idx in groups_of(episodes).items()}
    avg, pas = avg_pass_at_k([by_group[g] for g in sorted(by_group)])
    greedy = play_episodes(make_env, team_act(policies, greedy=True), list(seeds), 1)
    R = agent_rewards(episodes, roles)
    out = {f"avg@{k}": avg, f"pass@{k}": pas,
           "greedy_success": float(np.mean([ep.success for ep in greedy]))}
    out.update({f"reward_{role}": float(np.nanmean(R[:, j])) for j, role in enumerate(roles)})
    return out
