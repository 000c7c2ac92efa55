"""IGPO: information-gain turn rewards for multi-turn agents (and the InfoPO and E-GRPO cells).

Wang, Dai, Ye, Gan, Yao, Deng, Wu, Ying (2025), "Information Gain-based Policy Optimization: A
Simple and Effective Approach for Multi-Turn LLM Agents", arXiv:2510.14967 (reference code
github.com/GuoqingWang1/IGPO). Each turn t of an episode is scored by how much it raised the
policy's own probability of producing the ground-truth answer,

    IG_t = p(gold | h_{t+1}) - p(gold | h_t),        h_t = the history before turn t,

the last turn by the outcome R, and the advantage is the discounted sum of the *group-normalised*
turn rewards (all turn rewards of a group normalised together, "joint" in the reference code):

    r_t = w IG_t (t < T-1),  r_{T-1} = R;   r~ = (r - mean_group) / (std_group + eps);
    A_t = sum_{k >= t} gamma^(k-t) r~_k.

Taken from the reference code (``verl/trainer/ppo/core_algos.py``): the joint normalisation over
the group's turn rewards, the last turn carrying the outcome alone, the turn-level discounted
accumulation. This library's conventions (``credit.py``): std with ``ddof=1``, ``eps=1e-4``, a
group of one or of all-equal rewards gives exactly 0 (the reference uses ddof=0 and std 1 for a
group of one); ``last_turn="sum"`` adds the last turn's information gain to R (a variant).

``p_gold`` is an explicit argument: a list of (T_i + 1,) arrays, p(gold | h_0), ..., p(gold | h_T)
(the last entry is after the final turn; with ``last_turn="outcome"`` it is not used). Helpers:

- ``tq_p_gold(episodes, env, head, probs_fn)``: TwentyQuestions. ``head="policy"``: the policy's
  own answer head, pi(guess gold | k) / sum_i pi(guess i | k) (its guess distribution renormalised
  over the guesses; the tabular analogue of the LM's forced answer); ``head="posterior"``: the exact
  Bayesian answer 1[gold in b] / |b| of a calibrated answerer (an oracle head).
- ``grid_p_gold(episodes, probs_fn, env)``: the GridAgentEnv adapter for the credit arena (below).
- ``lm_p_gold(model, tokenizer, episodes, answers, gold)``: an LM's teacher-forced probability of
  the gold answer text after each history (``rollout.action_logps``).

**The GridAgentEnv adapter (for the arena).** A gridworld has no answer to state, so the "gold
answer" is the expert plan: p(gold | h_t) = the probability that the behaviour policy, from the
state s_t, follows *a shortest path* to the goal move by move (slip ignored: the plan, not the
world's noise). By the recursion over the BFS distance d to the goal (walls and edges keep the
agent in place),

    q(goal) = 1,   q(s) = sum_{a: d(s') = d(s) - 1} pi(a | s) q(s'),   q = 0 where the goal is unreachable,

so IG_t = q(s_{t+1}) - q(s_t) is positive for a step along an expert path that the policy was
unsure of, and negative for a step off every shortest path. Arena call, with the behaviour
policy ``policy`` (a ``KeyTablePolicy(key="state")``):

    probs_fn = lambda keys: policy.probs(keys).detach().numpy()
    igpo_advantages(episodes, grid_p_gold(episodes, probs_fn, env), gamma=0.95)

``probs_fn(keys) -> (N, A)`` probabilities over ``env.actions`` for state keys (cell, goal); it is
called on every free cell of each goal in the batch (a KeyTablePolicy adds a uniform row for a
key it had not seen).

**Zero-variance groups** (the paper's motivation): ``zero_variance_share(episodes, advantages)``,
the share of groups whose every turn advantage is 0 (outcome-only GRPO: every member's return
equal; such a group gives no gradient).

**InfoPO** ("InfoPO: Information-Driven Policy Optimization for User-Centric Agents", code
github.com/kfq20/InfoPO; forms inferred from its abstract): a turn's information reward is how
much its feedback changes the agent's next action distribution, KL(pi(.|h_{t+1}) || pi(.|h_{t+1}
with the feedback masked)) (``tq_feedback_divergence``: the masked history keeps the belief of
before the answer), fused with the outcome advantage by a variance gate
A_t = A^out + lam * g * A^info_t, g = max(0, 1 - std_group(R) / gate_scale) (``infopo_advantages``):
the information term counts most where the outcomes of the group do not separate.

**E-GRPO** ("Repurposing Synthetic Data for Fine-grained Search Agent Supervision", Tongyi Lab
2025; form inferred from its abstract): GRPO on a reward that gives a failed episode partial
credit ``alpha * found`` for the fraction of ground-truth entities it found (``egrpo_advantages``;
``tq_found_fraction``: the share of wrong items eliminated in TwentyQuestions).
"""

from __future__ import annotations

from collections import deque

import numpy as np

from agentrl_lib.algorithms.credit import group_normalise, group_normalise_turns, groups_of, \
    normalise_within, returns_to_go

LAST_TURN = ("outcome", "sum")
HEADS = ("policy", "posterior")


def _check_per_turn(episodes, values, extra: int, name: str) -> list[np.ndarray]:
    """values as float64 arrays, each of length T_i + extra, or a clear error."""
    if len(values) != len(episodes):
        raise ValueError(f"{name} has {len(values)} entries for {len(episodes)} episodes")
    out = []
    for i, (ep, v) in enumerate(zip(episodes, values)):
        v = np.asarray(v, dtype=np.float64).reshape(-1)
        if len(v) != len(ep) + extra:
            raise ValueError(f"{name}[{i}] has length {len(v)}; episode {i} has {len(ep)} turns, "
                             f"so it needs {len(ep) + extra}")
        out.append(v)
    return out


def info_gain_rewards(episodes, p_gold) -> list[np.ndarray]:
    """IG_t = p(gold | h_{t+1}) - p(gold | h_t) of every turn, (T_i,) per episode.

    >>> from agentrl_lib.rollout import Episode
    >>> info_gain_rewards([Episode.of("ab", [0, 1])], [[0.25, 0.5, 1.0]])[0].tolist()
    [0.25, 0.5]
    """
    return [np.diff(p) for p in _check_per_turn(episodes, p_gold, 1, "p_gold")]


def igpo_turn_rewards(episodes, p_gold, ig_weight: float = 1.0,
                      last_turn: str = "outcome") -> list[np.ndarray]:
    """r_t = ig_weight * IG_t for t < T-1; the last turn gets the outcome R (the episode's
    undiscounted return), ``last_turn="outcome"`` (the paper), or R + ig_weight * IG_{T-1}
    (``"sum"``). (T_i,) per episode."""
    if last_turn not in LAST_TURN:
        raise ValueError(f"last_turn must be one of {LAST_TURN}, got {last_turn!r}")
    out = []
    for ep, ig in zip(episodes, info_gain_rewards(episodes, p_gold)):
        r = ig_weight * ig  # (T,)
        if len(ep):
            r[-1] = ep.ret + (r[-1] if last_turn == "sum" else 0.0)
        out.append(r)
    return out


def igpo_advantages(episodes, p_gold, gamma: float = 0.95, norm_adv: bool = True, ddof: int = 1,
                    eps: float = 1e-4, ig_weight: float = 1.0,
                    last_turn: str = "outcome") -> list[np.ndarray]:
    """IGPO's turn advantages, (T_i,) per episode: the turn rewards of ``igpo_turn_rewards``,
    normalised jointly over all turns of the group's episodes (``credit.group_normalise``: zeros for a
    group with a single turn reward or all-equal ones), then summed to go with ``gamma``:
    A_t = sum_{k>=t} gamma^(k-t) r~_k.

    p_gold: per episode, p(gold | h_0..h_T), (T_i + 1,).
    """
    rewards = igpo_turn_rewards(episodes, p_gold, ig_weight, last_turn)
    normed = group_normalise_turns(episodes, rewards, norm_adv, ddof, eps)
    return [returns_to_go(r, gamma) for r in normed]


def zero_variance_share(episodes, advantages=None, tol: float = 1e-12) -> float:
    """The share of groups (``group_id``) that carry no learning signal: every turn advantage
    |A_t| <= tol, or, with ``advantages=None``, every member's return equal (outcome-only GRPO's
    zero-variance groups). 0.0 for an empty batch.

    >>> from agentrl_lib.rollout import Episode
    >>> eps = [Episode.of("a", [1.0], 0), Episode.of("a", [1.0], 0), Episode.of("a", [0.0], 1),
    ...        Episode.of("a", [1.0], 1)]
    >>> zero_variance_share(eps)
    0.5
    """
    groups = groups_of(episodes)
    if not groups:
        return 0.0
    if advantages is None:
        dead = [len({episodes[i].ret for i in idx}) == 1 for idx in groups.values()]
    else:
        adv = _check_per_turn(episodes, advantages, 0, "advantages")
        dead = [all(np.all(np.abs(adv[i]) <= tol) for i in idx) for idx in groups.values()]
    return float(np.mean(dead))


# --- p(gold | h) for the environments ----------------------------------------------------------------
def tq_p_gold(episodes, env, head: str = "posterior", probs_fn=None) -> list[np.ndarray]:
    """p(gold | h_t) for t = 0..T of TwentyQuestions episodes (state keys (belief, turn)), (T_i + 1,).

    head="posterior": 1[gold in b_t] / |b_t| (the exact Bayesian answer; needs no policy), and 1
    after a correct guess (the env's state key then keeps the belief of before the guess).
    head="policy": the policy's answer head, probs_fn(keys)[:, Q + gold] / sum_i probs_fn(keys)[:, Q + i]
    (Q = env.num_questions), i.e. its guess distribution renormalised over the guesses.
    """
    if head not in HEADS:
        raise ValueError(f"head must be one of {HEADS}, got {head!r}")
    if head == "policy" and probs_fn is None:
        raise ValueError("head='policy' needs probs_fn(keys) -> (N, A) action probabilities")
    out = []
    for i, ep in enumerate(episodes):
        if ep.task not in env.items:
            raise ValueError(f"episode {i}: task {ep.task!r} is not an item of the env")
        gold = env.items.index(ep.task)
        keys = list(ep.state_keys) + [ep.next_state_key]
        if head == "posterior":
            p = np.array([float(gold in b) / len(b) for b, _ in keys])
            if ep.success:  # a correct guess reveals the item (the env keeps the belief before it)
                p[-1] = 1.0
            out.append(p)
        else:
            p = np.asarray(probs_fn(keys), dtype=np.float64)[:, env.num_questions:]  # (T+1, K)
            out.append(p[:, gold] / p.sum(-1))
    return out


def grid_shortest_distances(env, goal: tuple) -> dict:
    """BFS distance (moves) of every free cell of ``env.layout`` to ``goal``; unreachable cells
    are left out. Moves into a wall or off the grid stay in place."""
    dist, queue = {tuple(goal): 0}, deque([tuple(goal)])
    while queue:
        r, c = queue.popleft()
        for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1)):
            n = (r + dr, c + dc)
            if (0 <= n[0] < env.rows and 0 <= n[1] < env.cols and env.layout[n[0]][n[1]] != "#"
                    and n not in dist):
                dist[n] = dist[(r, c)] + 1
                queue.append(n)
    return dist


_GRID_MOVES = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}


def grid_expert_path_probability(env, goal: tuple, probs_fn) -> dict:
    """q(cell) = P(the policy follows a shortest path from cell to goal), slip ignored:
    q(goal) = 1, q(s) = sum_{a: d(s') = d(s) - 1} pi(a | (s, goal)) q(s'). {cell: q}."""
    dist = grid_shortest_distances(env, goal)
    cells = sorted(dist, key=dist.get)  # goal first, then by distance
    probs = np.asarray(probs_fn([(c, tuple(goal)) for c in cells]), dtype=np.float64)  # (C, A)
    q = {}
    for cell, p in zip(cells, probs):
        if dist[cell] == 0:
            q[cell] = 1.0
            continue
        total = 0.0
        for a, name in enumerate(env.actions):
            dr, dc = _GRID_MOVES[name]
            n = (cell[0] + dr, cell[1] + dc)
            if dist.get(n, -1) == dist[cell] - 1:
                total += p[a] * q[n]
        q[cell] = total
    return q


def grid_p_gold(episodes, probs_fn, env) -> list[np.ndarray]:
    """The GridAgentEnv adapter: p(gold | h_t) = q(s_t) of ``grid_expert_path_probability`` for
    t = 0..T (s_T = ``next_state_key``), (T_i + 1,) per episode. State keys are (cell, goal)."""
    tables: dict = {}
    out = []
    for ep in episodes:
        keys = list(ep.state_keys) + [ep.next_state_key]
        vals = []
        for cell, goal in keys:
            goal = tuple(goal)
            if goal not in tables:
                tables[goal] = grid_expert_path_probability(env, goal, probs_fn)
            vals.append(tables[goal].get(tuple(cell), 0.0))
        out.append(np.array(vals))
    return out


def lm_p_gold(model, tokenizer, episodes, answers: list[str], gold, system_prompt=None,
              mode: str = "raw", batch_size: int = 64) -> list[np.ndarray]:
    """An LM's p(gold | h_t), t = 0..T, by teacher-forcing the answer texts after each history:
    the context of turn t is the first prompt and the conversation up to turn t's action; h_T adds
    the final observation. mode="raw": exp(log p(gold text + end of turn)) (IGPO's probability of
    generating the ground truth); "answers": that probability renormalised over ``answers``.

    answers: the candidate answer texts (e.g. TwentyQuestions' guesses); gold: per episode the
    index of its gold answer in ``answers``. Needs token-level episodes. (T_i + 1,) per episode.
    """
    from agentrl_lib.rollout import action_logps, observation_text, token_ids

    if mode not in ("raw", "answers"):
        raise ValueError(f"mode must be 'raw' or 'answers', got {mode!r}")
    contexts, owner = [], []
    for i, ep in enumerate(episodes):
        if ep.turn_spans is None:
            raise ValueError(f"episode {i} has no token fields (lm_p_gold needs LM episodes)")
        seq = list(ep.prompt_ids)
        for start, _ in ep.turn_spans:
            contexts.append(seq + list(ep.token_ids[:start]))
            owner.append(i)
        tail = token_ids(tokenizer, observation_text(tokenizer, ep.final_observation, system_prompt))
        contexts.append(seq + list(ep.token_ids) + tail)
        owner.append(i)
    was_training = model.training
    model.eval()
    import torch

    with torch.no_grad():
        lp = action_logps(model, tokenizer, contexts, answers, batch_size).numpy()  # (N, A)
    model.train(was_training)
    out = [[] for _ in episodes]
    for row, i in zip(lp, owner):
        g = int(gold[i])
        if mode == "raw":
            out[i].append(float(np.exp(row[g])))
        else:
            out[i].append(float(np.exp(row[g] - np.logaddexp.reduce(row))))
    return [np.array(v) for v in out]


# --- InfoPO and E-GRPO cells --------------------------------------------------------------------------
def tq_feedback_divergence(episodes, probs_fn, tiny: float = 1e-12) -> list[np.ndarray]:
    """InfoPO's turn information reward on TwentyQuestions: KL(pi(.|k_{t+1}) || pi(.|k~_{t+1}))
    with k_{t+1} = (b_{t+1}, t+1) the state after the answer and k~_{t+1} = (b_t, t+1) the same turn
    with the answer masked (the belief of before it). 0 on the last turn (no next action). (T_i,)."""
    out = []
    for ep in episodes:
        T = len(ep)
        if T <= 1:
            out.append(np.zeros(T))
            continue
        seen = [ep.state_keys[t + 1] for t in range(T - 1)]
        masked = [(ep.state_keys[t][0], ep.state_keys[t + 1][1]) for t in range(T - 1)]
        p = np.asarray(probs_fn(seen), dtype=np.float64)  # (T-1, A)
        m = np.asarray(probs_fn(masked), dtype=np.float64)  # (T-1, A)
        kl = (p * (np.log(p + tiny) - np.log(m + tiny))).sum(-1)
        out.append(np.concatenate([kl, [0.0]]))
    return out


def infopo_advantages(episodes, info, gamma: float = 0.95, lam: float = 1.0,
                      gate_scale: float = 0.5, norm_adv: bool = True, ddof: int = 1,
                      eps: float = 1e-4) -> list[np.ndarray]:
    """A_t = A^out + lam * g * A^info_t (form inferred): A^out the outcome R normalised in its
    group and broadcast (GRPO); A^info the information rewards ``info`` normalised jointly over the
    group's turns and summed to go with ``gamma``; the variance gate g = max(0, 1 - std(R)/gate_scale)
    of the group (std with ``ddof``; 1 when the outcomes are all equal, 0 at gate_scale, the largest
    std of a 0/1 outcome for 0.5)."""
    info = _check_per_turn(episodes, info, 0, "info")
    out = [np.zeros(len(ep)) for ep in episodes]
    for idx in groups_of(episodes).values():
        R = np.array([episodes[i].ret for i in idx])
        a_out = group_normalise(R, norm_adv, ddof, eps)
        std = R.std(ddof=ddof) if len(R) > ddof else 0.0
        g = max(0.0, 1.0 - std / gate_scale)
        flat = np.concatenate([info[i] for i in idx])
        z = group_normalise(flat, norm_adv, ddof, eps)
        start = 0
        for i, a in zip(idx, a_out):
            T = len(info[i])
            out[i] = a + lam * g * returns_to_go(z[start:start + T], gamma)
            start += T
    return out


def egrpo_rewards(episodes, found, alpha: float = 0.5) -> np.ndarray:
    """E-GRPO's reward: R for a successful episode, alpha * found_i (the fraction of ground-truth
    entities it found, in [0, 1]) for a failed one. (num_episodes,)."""
    found = np.asarray(found, dtype=np.float64).reshape(-1)
    if len(found) != len(episodes):
        raise ValueError(f"found has {len(found)} entries for {len(episodes)} episodes")
    if np.any(found < 0) or np.any(found > 1):
        raise ValueError("found must be fractions in [0, 1]")
    return np.array([ep.ret if ep.success else alpha * f for ep, f in zip(episodes, found)])


def egrpo_advantages(episodes, found, alpha: float = 0.5, norm_adv: bool = True, ddof: int = 1,
                     eps: float = 1e-4) -> list[np.ndarray]:
    """GRPO on ``egrpo_rewards``: normalised in the group, broadcast to every turn."""
    R = egrpo_rewards(episodes, found, alpha)
    adv = normalise_within(R, groups_of(episodes).values(), norm_adv, ddof, eps)
    return [np.full(len(ep), a) for ep, a in zip(episodes, adv)]


def tq_found_fraction(episodes, env) -> np.ndarray:
    """The TwentyQuestions analogue of entities found: the share of the K - 1 wrong items that the
    episode's answers eliminated, (K - |b_T|) / (K - 1) with b_T the final belief; 1 for a
    successful episode (its correct guess identified the item). (num_episodes,)."""
    K = env.num_items
    if K < 2:
        return np.ones(len(episodes))
    return np.array([1.0 if ep.success else (K - len(ep.next_state_key[0])) / (K - 1)
                     for ep in episodes])
