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
  the gold answer text after each history. ``mode="mean"`` (the released code's, issue 27): the
  geometric mean of the answer tokens' probabilities, exp(mean_j log pi(g_j | h, g_<j)), the end of
  turn left out (``generation.py`` forces the pseudo-response "... <answer>\n{gt}\n</answer>" and
  takes ``exp(old_log_probs[gt span].mean())``); ``"raw"`` (ours before issue 27): the product
  over the answer text and the end-of-turn token; ``"answers"``: "raw" renormalised over the
  candidate answers.

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
github.com/kfq20/InfoPO @ c26e93c): a turn's information reward is how much its feedback changes
the agent's next action distribution, KL(pi(.|h_{t+1}) || pi(.|h_{t+1} with the feedback masked))
(``tq_feedback_divergence``, exact over the actions; the masked history keeps the belief of before
the answer), credited to the turn whose feedback it measures. ``infopo_advantages`` is the
released ``core_algos.compute_info_grpo_advantage`` with one token per turn (a table's action):

    A^out_i   = (R_i - mean_g R) / (std_g R + eps)            (GRPO; a group of one: mean 0, std 1)
    A^info_it = (x_it - m_g) / (s_g + eps) where x_it != 0, else 0
                (m_g, s_g: mean and std over the group's NON-ZERO values; one value: s_g = 1)
    rho       = min(1, max(std(A^out), 1) / std(A^info))    (over every turn of the batch, + eps)
    A_it      = A^out_i + beta * sigmoid(-std_g R / T) * rho * A^info_it,

stds of ddof 1 (torch's), eps 1e-6, no sum to go. The gate is at most 1/2 (a group whose outcomes
are all equal) and falls with the group's outcome spread; beta = intrinsic_weight * exp(-decay *
epoch). Defaults beta = 0.5, T = 0.5: the released training config
(``examples/sglang_multiturn/config/grpo_multiturn.yaml``, the README's script); the function's
and ``ppo_trainer.yaml``'s fallbacks are beta = 0.1, T = 0.05.

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


LM_P_MODES = ("mean", "raw", "answers")


def _answer_token_logps(model, tokenizer, contexts, answer_texts,
                        batch_size: int = 64) -> list[np.ndarray]:
    """log pi(g_j | context, g_<j) of every token of each answer text teacher-forced after its
    context (no end-of-turn token), one (len(g),) array per context: right-padded forward passes
    through ``rollout.example_logps`` (the answer tokens are the loss mask)."""
    import torch

    from agentrl_lib.rollout import example_logps, token_ids

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    out = []
    with torch.no_grad():
        for i in range(0, len(contexts), batch_size):
            examples = []
            for ctx, text in zip(contexts[i:i + batch_size], answer_texts[i:i + batch_size]):
                g = token_ids(tokenizer, text)
                examples.append((list(ctx) + g, [0] * len(ctx) + [1] * len(g)))
            logps, mask = example_logps(model, examples, pad)  # (B, L-1) each
            for row, m in zip(logps.double().cpu().numpy(), mask.cpu().numpy()):
                out.append(row[m > 0])
    return out


def lm_p_gold(model, tokenizer, episodes, answers: list[str], gold, system_prompt=None,
              mode: str = "mean", batch_size: int = 64) -> list[np.ndarray]:
    """An LM's p(gold | h_t), t = 0..T, by teacher-forcing the gold answer text after each history:
    the context of turn t is the first prompt and the conversation up to turn t's action; h_T adds
    the final observation.

    mode="mean" (the released code's): exp(mean_j log pi(g_j | h_t, g_<j)) over the tokens of the
    gold answer text, the end-of-turn token left out: the geometric mean per-token probability
    (``scrl/llm_agent/generation.py``: ``exp(old_log_probs[gt_idx[0]:gt_idx[1]].mean())``, the span
    of the ground truth inside a forced "<answer>" pseudo-response). "raw" (ours before issue 27):
    exp(log p(gold text + end of turn)), the product over all its tokens; "answers": that
    probability renormalised over ``answers``.

    answers: the candidate answer texts (e.g. TwentyQuestions' guesses); gold: per episode the
    index of its gold answer in ``answers``. Needs token-level episodes. (T_i + 1,) per episode.
    """
    from agentrl_lib.rollout import action_logps, observation_text, token_ids

    if mode not in LM_P_MODES:
        raise ValueError(f"mode must be one of {LM_P_MODES}, got {mode!r}")
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

    out = [[] for _ in episodes]
    if mode == "mean":
        texts = [answers[int(gold[i])] for i in owner]
        for lps, i in zip(_answer_token_logps(model, tokenizer, contexts, texts, batch_size), owner):
            out[i].append(float(np.exp(lps.mean())))
        model.train(was_training)
        return [np.array(v) for v in out]
    with torch.no_grad():
        lp = action_logps(model, tokenizer, contexts, answers, batch_size).numpy()  # (N, A)
    model.train(was_training)
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


def _std1(x: np.ndarray) -> float:
    """torch's ``Tensor.std()`` (ddof 1); nan for fewer than two values, as torch gives."""
    return float(x.std(ddof=1)) if len(x) > 1 else float("nan")


def infopo_advantages(episodes, info, beta: float = 0.5, gate_temperature: float = 0.5,
                      decay: float = 0.0, epoch: int = 0, norm_adv: bool = True,
                      eps: float = 1e-6) -> list[np.ndarray]:
    """InfoPO's turn advantages, (T_i,) per episode: the released
    ``core_algos.compute_info_grpo_advantage`` (kfq20/InfoPO @ c26e93c, registered "info_grpo")
    with one token per turn,

        A_it = A^out_i + beta_t * g_i * rho * A^info_it,   beta_t = beta * exp(-decay * epoch),

    A^out the outcome R normalised in its group (ddof 1, eps; a group of one: mean 0, std 1) on
    every turn; A^info the information rewards ``info`` normalised per group over its NON-ZERO
    values (mean, ddof-1 std; a single non-zero value: std 1), zeros left at 0, no sum to go;
    g_i = sigmoid(-std(R of i's group) / gate_temperature) (std 1 for a group of one); rho =
    min(1, max(std(A^out) + eps, 1) / (std(A^info) + eps)), the stds over every turn of the
    batch (zeros included): the information term scaled down when it is wider than the outcome
    term. ``norm_adv=False`` centres without dividing (``norm_adv_by_std_in_grpo``). With fewer
    than two turns in the batch torch's std is nan and the released min(...) returns 1: so here.

    >>> from agentrl_lib.rollout import Episode
    >>> eps = [Episode.of("ab", [0.0, 0.0], 0), Episode.of("ab", [0.0, 0.0], 0)]
    >>> [a.round(4).tolist() for a in infopo_advantages(eps, [[0.3, 0.0], [0.1, 0.0]])]
    [[0.1768, 0.0], [-0.1768, 0.0]]
    """
    info = _check_per_turn(episodes, info, 0, "info")
    a_out = [np.zeros(len(ep)) for ep in episodes]
    a_info = [np.zeros(len(ep)) for ep in episodes]
    gate = np.zeros(len(episodes))
    for idx in groups_of(episodes).values():
        R = np.array([episodes[i].ret for i in idx], dtype=np.float64)
        mean, std = (0.0, 1.0) if len(R) == 1 else (R.mean(), _std1(R))
        for i in idx:
            a_out[i][:] = (episodes[i].ret - mean) / (std + eps) if norm_adv else \
                episodes[i].ret - mean
            gate[i] = 1.0 / (1.0 + np.exp(std / gate_temperature))  # sigmoid(-std / T)
        nz = np.concatenate([info[i][info[i] != 0] for i in idx])
        if len(nz) == 0:
            continue  # no information in the group: A^info stays 0
        m, s = (nz[0], 1.0) if len(nz) == 1 else (nz.mean(), _std1(nz))
        for i in idx:
            x, keep = info[i], info[i] != 0
            a_info[i][keep] = (x[keep] - m) / (s + eps) if norm_adv else x[keep] - m
    flat_out, flat_info = np.concatenate(a_out), np.concatenate(a_info)
    ratio = min(1.0, max(_std1(flat_out) + eps, 1.0) / (_std1(flat_info) + eps))
    if np.isnan(ratio):  # fewer than two turns: torch's nan std, and min(1.0, nan) is 1.0
        ratio = 1.0
    beta_t = beta * np.exp(-decay * epoch)
    return [o + beta_t * g * ratio * x for o, g, x in zip(a_out, gate, a_info)]


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
