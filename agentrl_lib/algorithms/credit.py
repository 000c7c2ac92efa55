"""Turn-level credit assignment for multi-turn agents: advantage estimators over ``Episode`` records.

Every estimator maps a batch of episodes (``agentrl_lib.rollout.Episode``) to one advantage per
turn, as a list of float64 arrays (one per episode, shape (T_i,)). ``to_token_advantages`` then
spreads turn advantages over the tokens of each turn's action for an LM update.

- ``grpo_broadcast``: the trajectory-level GRPO advantage of the episode's return, normalised in
  its group and copied to every turn (what single-turn GRPO does when applied to agents).
- ``gigpo_advantages``: GiGPO (Feng et al. 2025, "Group-in-Group Policy Optimization for LLM
  Agent Training", arXiv:2505.10978): the episode-level advantage plus ``omega`` times a step-level
  advantage computed in *anchor-state groups*, i.e. all turns of a group's episodes that act from
  the same state, each scored by its discounted return-to-go. Taken from the paper: A = A^E +
  omega * A^S, gamma = 0.95, omega = 1, normalisation by the group std or by 1 ("mean_norm").
  From the reference code (verl-agent ``gigpo/core_gigpo.py``, ``step_group_reward``, read from
  stored copies: reproductions/fidelity/31_gigpo.md): a singleton anchor group gets A^S = 0
  and std uses ddof=1 (as the episode groups).
  ``anchor_share`` is the fraction of turns in groups of two or more (where A^S can be nonzero).
- ``turn_gae``: GAE over turns with a critic's V(s_t) (turn-level PPO; ArCHer's critic is in
  ``archer.py``, SPA-RL's progress model in ``spa.py``).
- ``cm2_advantages``: CM2 (Zhang et al. 2026, "CM2: Reinforcement Learning with Checklist Rewards
  for Multi-Turn and Multi-Step Agentic Tool Use", arXiv:2602.12268) over one group's per-turn
  checklist rewards R_t: trajectory-level (Eq. 4-5, the paper's final method) or turn-level
  (Eq. 7, normalised per turn index), F_norm = 1 by default (App.: GRPO with the std term set to
  1; the released ``traj_n48.sh``: ``norm_adv_by_std_in_grpo=False``).

The estimators are pure functions of the record and their arguments; the maths (discounted returns, group
normalisation, GAE) is ``agentrl_lib.core``'s. The pieces every turn-level estimator shares are here
once: ``groups_of`` (the task groups), ``normalise_within`` (collect each group's values, normalise,
scatter back), ``returns_to_go`` (numpy, one episode) and ``fit_critic`` (the tabular Monte-Carlo
critic of 'turn_gae' and 'hiper'); ``turn_credit`` picks an estimator by name.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import torch

from agentrl_lib.core import discounted_returns, gae_advantages


def returns_to_go(rewards, gamma: float) -> np.ndarray:
    """G_t = r_t + gamma G_{t+1} (G_T = 0) of one reward sequence, (T,) -> (T,) float64: the
    numpy form of ``core.discounted_returns`` for one row, for loops over ragged per-episode
    arrays (``tests/test_credit.py`` checks it is bit-identical to it)."""
    r = np.asarray(rewards, dtype=np.float64)
    out, acc = np.zeros(len(r)), 0.0
    for t in range(len(r) - 1, -1, -1):
        acc = r[t] + gamma * acc
        out[t] = acc
    return out


def groups_of(episodes) -> dict:
    """{group_id: [episode indices, ascending]}, groups in order of first appearance: the task
    groups every group-relative estimator normalises within."""
    groups: dict = {}
    for i, ep in enumerate(episodes):
        groups.setdefault(ep.group_id, []).append(i)
    return groups


def episode_returns_to_go(episodes, gamma: float) -> list[np.ndarray]:
    """G_t = sum_k gamma^k r_{t+k} of every turn of every episode, (T_i,) each: one
    ``core.discounted_returns`` call on the rewards right-padded with zeros to (B, T) (float64;
    the padding adds exactly 0 to every real return)."""
    T = max((len(ep) for ep in episodes), default=0)
    r = torch.zeros(len(episodes), T, dtype=torch.float64, device="cpu")  # (B, T) host numerics
    for i, ep in enumerate(episodes):
        r[i, :len(ep)] = torch.tensor(ep.rewards, dtype=torch.float64, device="cpu")
    g = discounted_returns(r, gamma).numpy()  # (B, T)
    return [g[i, :len(ep)] for i, ep in enumerate(episodes)]


def group_normalise(values: np.ndarray, norm_adv: bool, ddof: int, eps: float) -> np.ndarray:
    """``core.grpo_advantages`` of one ragged group, (n,) -> (n,); zeros for a group of one (the
    group normalisation every turn-level estimator here shares: GiGPO, SALT, HGPO, OPRL, IGPO, ...).
    Written in numpy because anchor groups are many and tiny: a torch call per group made GiGPO's
    advantages ten times slower (measured on notebook 31). ``tests/test_credit.py`` checks it
    equals ``core.grpo_advantages``."""
    if len(values) < 2 or np.all(values == values[0]):  # no signal: exactly 0 (core.all_equal)
        return np.zeros(len(values))
    centred = values - values.mean()
    return centred / (values.std(ddof=ddof) + eps) if norm_adv else centred


def normalise_within(values, groups, norm_adv: bool = True, ddof: int = 1,
                     eps: float = 1e-4):
    """``group_normalise`` of each group's values, scattered back to their places (0 where no
    group reaches). Either values (N,) with groups of indices into it, -> (N,); or values a list
    of (T_i,) arrays with groups of (i, t) pairs, -> a list of (T_i,) arrays. A group's values
    are taken in its members' order (which fixes the float summation order)."""
    if isinstance(values, np.ndarray):
        out = np.zeros(len(values))
        for members in groups:
            out[members] = group_normalise(values[members], norm_adv, ddof, eps)
        return out
    out = [np.zeros(len(v)) for v in values]
    for members in groups:
        z = group_normalise(np.array([values[i][t] for i, t in members], dtype=np.float64),
                            norm_adv, ddof, eps)
        for (i, t), a in zip(members, z):
            out[i][t] = a
    return out


def group_normalise_turns(episodes, turn_values, norm_adv: bool = True, ddof: int = 1,
                          eps: float = 1e-4) -> list[np.ndarray]:
    """Normalise per-turn values over all turns of each group's episodes jointly (groups:
    ``ep.group_id``): list of (T_i,) -> list of (T_i,), ``group_normalise`` of the concatenation,
    split back per episode (IGPO's turn rewards, ReSeek's turn-level returns)."""
    groups = [[(i, t) for i in idx for t in range(len(turn_values[i]))]
              for idx in groups_of(episodes).values()]
    return normalise_within(turn_values, groups, norm_adv, ddof, eps)


def cm2_advantages(turn_rewards, level: str = "trajectory", num_turns: int | None = None,
                   norm_adv: bool = False, ddof: int = 1, eps: float = 1e-6,
                   min_holders: int = 2) -> list[np.ndarray]:
    """CM2's advantages of one group of G rollouts of the same task from their per-turn
    checklist rewards R^(i)_t (Eq. 6, in [0, 1]): a list of (T_i,) arrays -> a list of (T_i,).

    - ``'trajectory'`` (the paper's final CM2, Eq. 4-5): R^(i) = (1/L) sum_t R^(i)_t and
      A^(i) = (R^(i) - mean_G R) / F_norm on every turn of rollout i. L is ``num_turns`` when
      given: the released code divides by the reference dialogue's number of turns, the same for
      the whole group (``reward_manager/checklist.py``, ``_async_call``: ``reward_tensor /=
      max_num_turns_tensor``; verl's ``compute_grpo_outcome_advantage`` then centres the summed
      score), so a rollout ended early forgoes the turns it never played; None: the rollout's own
      L^(i), as Eq. 4 is written.
    - ``'turn'`` (Eq. 7): A^(i)_t = (R^(i)_t - mean_j R^(j)_t) / F_norm over the rollouts j that
      reached turn t; a turn index held by fewer than ``min_holders`` rollouts gets 0. The
      released ``core_algos.py`` (``compute_checklist_step_advantage``) zeroes positions with
      <= 4 holders, i.e. ``min_holders=5``; the paper states no threshold (2: a lone holder's
      centred value is 0 anyway).
    - ``'pooled'`` (not the paper's; this project's first version): one mean over all turns of
      all rollouts of the group, so turn 0 is compared with every later turn too.

    F_norm = 1 unless ``norm_adv`` (then the std with ``ddof``, plus ``eps``; verl's 1e-6).
    A group whose values are all equal gets 0 (``group_normalise``).

    >>> a = cm2_advantages([np.array([1.0, 0.5]), np.array([1.0])], num_turns=2)
    >>> [x.tolist() for x in a]  # R = (0.75, 0.5): A = +-0.125 on every turn
    [[0.125, 0.125], [-0.125]]
    >>> [x.tolist() for x in cm2_advantages([np.array([1.0, 0.5]), np.array([0.0])], "turn")]
    [[0.5, 0.0], [-0.5]]
    """
    rewards = [np.asarray(r, dtype=np.float64) for r in turn_rewards]
    if level == "trajectory":
        R = np.array([r.sum() / (len(r) if num_turns is None else num_turns) if len(r) else 0.0
                      for r in rewards])
        adv = group_normalise(R, norm_adv, ddof, eps)
        return [np.full(len(r), a) for r, a in zip(rewards, adv)]
    if level == "turn":
        out = [np.zeros(len(r)) for r in rewards]
        for t in range(max((len(r) for r in rewards), default=0)):
            holders = [i for i, r in enumerate(rewards) if len(r) > t]
            if len(holders) < min_holders:
                continue
            z = group_normalise(np.array([rewards[i][t] for i in holders]), norm_adv, ddof, eps)
            for i, a in zip(holders, z):
                out[i][t] = a
        return out
    if level == "pooled":
        groups = [[(i, t) for i, r in enumerate(rewards) for t in range(len(r))]]
        return normalise_within(rewards, groups, norm_adv, ddof, eps)
    raise ValueError(f"unknown level {level!r}; choose 'trajectory', 'turn' or 'pooled'")


def episode_advantages(episodes, gamma: float = 1.0, norm_adv: bool = True, ddof: int = 1,
                       eps: float = 1e-4) -> np.ndarray:
    """A^E_i: each episode's discounted return normalised within its group; (num_episodes,)."""
    rets = np.array([g[0] if len(g) else 0.0 for g in episode_returns_to_go(episodes, gamma)])
    return normalise_within(rets, groups_of(episodes).values(), norm_adv, ddof, eps)


def step_scores(episodes, gamma: float = 1.0, invalid_penalty: float = 0.0) -> list[np.ndarray]:
    """verl-agent's per-step rows' scores, (T_i,) per episode: every turn holds its episode's
    return R_i, minus ``invalid_penalty`` on the turns whose action was invalid (``ep.valid``).
    verl-agent @ 2716b30b: ``EpisodeRewardManager`` writes the episode reward on each step's row,
    ``ray_trainer.apply_invalid_action_penalty`` then subtracts ``invalid_action_penalty_coef`` x
    (1 - is_action_valid) from that row's score (and from its GiGPO step return) only.

    >>> from agentrl_lib.rollout import Episode
    >>> ep = Episode.of(["s", "x", "y"], [0.0, 0.0, 1.0], valid=[True, False, True])
    >>> step_scores([ep], invalid_penalty=0.1)[0].round(3).tolist()
    [1.0, 0.9, 1.0]
    """
    rets = [g[0] if len(g) else 0.0 for g in episode_returns_to_go(episodes, gamma)]
    return _penalise_invalid(episodes, rets, invalid_penalty)


def _penalise_invalid(episodes, values, invalid_penalty: float) -> list[np.ndarray]:
    """Each episode's per-turn ``values`` (or one value broadcast over its turns) less
    ``invalid_penalty`` on the turns whose action was invalid (verl-agent's
    ``apply_invalid_action_penalty``)."""
    return [v - invalid_penalty * (1.0 - np.asarray(ep.valid, dtype=np.float64))
            for ep, v in zip(episodes, values)]


def check_step_options(invalid_penalty: float, cross_steps: bool) -> None:
    """Refuse a per-turn penalty without per-turn statistics (``GRPOConfig`` and the credit
    functions both ask here)."""
    if invalid_penalty != 0.0 and not cross_steps:
        raise ValueError("invalid_penalty is per step (verl-agent's apply_invalid_action_penalty) "
                         "and needs cross_steps=True: with one score per episode the penalised "
                         "turns would be normalised by a std that need not see them")


def grpo_broadcast(episodes, gamma: float = 1.0, norm_adv: bool = True, ddof: int = 1,
                   eps: float = 1e-4, invalid_penalty: float = 0.0,
                   cross_steps: bool = False) -> list[np.ndarray]:
    """Trajectory-level GRPO: every turn of episode i gets A^E_i.

    cross_steps=True is verl-agent's GRPO on its per-step rows (``core_algos.
    compute_grpo_outcome_advantage``, ``compute_mean_std_cross_steps=True``, its default): each
    turn's score (``step_scores``: R_i, minus ``invalid_penalty`` on an invalid turn) normalised
    by the mean and std over every turn of the group's episodes (``group_normalise_turns``), so a
    longer episode weighs more in the group's statistics. ``invalid_penalty`` needs it.
    """
    check_step_options(invalid_penalty, cross_steps)
    if cross_steps:
        return group_normalise_turns(episodes, step_scores(episodes, gamma, invalid_penalty),
                                     norm_adv, ddof, eps)
    adv = episode_advantages(episodes, gamma, norm_adv, ddof, eps)
    return [np.full(len(ep), a) for ep, a in zip(episodes, adv)]


def anchor_groups(episodes, key=None) -> dict:
    """{(group_id, anchor key): [(episode index, turn), ...]}: the turns of one group's episodes
    that act from the same state. ``key(ep, t)`` defaults to ``ep.state_keys[t]``; pass e.g.
    ``lambda ep, t: ep.observations[t]`` to group by observation text, as the paper does."""
    key = key or (lambda ep, t: ep.state_keys[t])
    groups = defaultdict(list)
    for i, ep in enumerate(episodes):
        for t in range(len(ep)):
            groups[(ep.group_id, key(ep, t))].append((i, t))
    return dict(groups)


def anchor_share(episodes, key=None, min_size: int = 2) -> float:
    """The fraction of the batch's turns that sit in an anchor group (``anchor_groups``) of at
    least ``min_size`` turns: where GiGPO's step term can be nonzero (a singleton group gets
    A^S = 0, so on the other turns GiGPO is GRPO). 0.0 for a batch without turns.

    >>> from agentrl_lib.rollout import Episode
    >>> eps = [Episode.of(["s", "x"], [0, 1]), Episode.of(["s", "y", "z"], [0, 0, 0])]
    >>> anchor_share(eps)  # the two turns from s of 5
    0.4
    """
    turns = sum(len(ep) for ep in episodes)
    if turns == 0:
        return 0.0
    shared = sum(len(m) for m in anchor_groups(episodes, key).values() if len(m) >= min_size)
    return shared / turns


def step_advantages(episodes, gamma: float = 0.95, norm_adv: bool = True, ddof: int = 1,
                    eps: float = 1e-4, key=None, invalid_penalty: float = 0.0) -> list[np.ndarray]:
    """A^S: each turn's discounted return-to-go normalised within its anchor-state group; with
    ``invalid_penalty`` subtracted from the return of each invalid turn first (verl-agent's
    ``apply_invalid_action_penalty`` on ``step_rewards``, after the discounting)."""
    rtg = _penalise_invalid(episodes, episode_returns_to_go(episodes, gamma), invalid_penalty)
    return normalise_within(rtg, anchor_groups(episodes, key).values(), norm_adv, ddof, eps)


def gigpo_advantages(episodes, gamma: float = 0.95, omega: float = 1.0, norm_adv: bool = True,
                     ddof: int = 1, eps: float = 1e-4, key=None, invalid_penalty: float = 0.0,
                     cross_steps: bool = False) -> list[np.ndarray]:
    """GiGPO: A_t = A^E + omega * A^S_t. The episode term uses the undiscounted return (the
    paper's R(tau)); the step term the discounted return-to-go with ``gamma``. cross_steps and
    invalid_penalty: the episode term as ``grpo_broadcast``'s (verl-agent's ``episode_norm_reward``
    has the same ``compute_mean_std_cross_steps=True`` default), the step term as
    ``step_advantages``'."""
    check_step_options(invalid_penalty, cross_steps)
    a_e = grpo_broadcast(episodes, 1.0, norm_adv, ddof, eps, invalid_penalty, cross_steps)
    a_s = step_advantages(episodes, gamma, norm_adv, ddof, eps, key, invalid_penalty)
    return [a + omega * s for a, s in zip(a_e, a_s)]


def turn_gae(episodes, values, gamma: float = 0.95, lam: float = 0.95,
             last_values=None) -> list[np.ndarray]:
    """GAE over turns: delta_t = r_t + gamma V(s_{t+1}) - V(s_t), A_t = sum (gamma lam)^k delta_{t+k}.

    values: per episode, V(s_t) for each turn, (T_i,). last_values: per episode, V of the state
    after the last turn when the episode was truncated (ignored when it terminated); default 0.
    """
    out = []
    for i, (ep, v) in enumerate(zip(episodes, values)):
        T = len(ep)
        if T == 0:
            out.append(np.zeros(0))
            continue
        host = dict(dtype=torch.float64, device="cpu")
        r = torch.tensor(ep.rewards, **host)[None]  # (1, T)
        v_t = torch.as_tensor(np.asarray(v, dtype=np.float64), **host)[None]  # (1, T)
        done = torch.zeros(1, T, **host)
        v_last = 0.0 if last_values is None else float(last_values[i])
        if not ep.truncated:
            done[0, -1] = 1.0
        adv, _ = gae_advantages(r, v_t, done, torch.tensor([v_last], **host),
                                gamma, lam)
        out.append(adv[0].numpy())
    return out


def fit_critic(critic: dict, episodes, gamma: float, step: float) -> dict:
    """A tabular Monte-Carlo critic, updated in place and returned: V(k) += step * (G_t - V(k))
    for every visited (state key k, return-to-go G_t), in turn order (every visit). The critic of
    'turn_gae' and 'hiper' for table and LM agents alike (``turn_credit``)."""
    for ep, rtg in zip(episodes, episode_returns_to_go(episodes, gamma)):
        for k, g in zip(ep.state_keys, rtg):
            v = critic.get(k, 0.0)
            critic[k] = v + step * (g - v)
    return critic


def to_token_advantages(episodes, turn_advantages) -> list[torch.Tensor]:
    """Spread turn advantages over each turn's action tokens: (N_i,) per episode, 0 on
    environment tokens. Needs LM episodes (``turn_spans``)."""
    out = []
    for ep, adv in zip(episodes, turn_advantages):
        if ep.turn_spans is None:
            raise ValueError("to_token_advantages needs token-level episodes (turn_spans is None)")
        tok = torch.zeros(len(ep.token_ids), device="cpu")
        for (start, end), a in zip(ep.turn_spans, adv):
            tok[start:end] = float(a)
        out.append(tok)
    return out
