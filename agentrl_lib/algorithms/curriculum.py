"""SearchGym-RL's hop curriculum: a schedule of task distributions over hop counts, and the seed
sampler that draws training tasks whose hop counts follow it.

Zhang et al. (2026), "SearchGym: Bootstrapping Real-World Search Agents via Cost-Effective and
High-Fidelity Environment Simulation", arXiv:2601.14615. SearchGym-RL trains a search agent in
stages "from basic interactions to long-horizon planning": first on questions of few hops, then on
longer chains. Here a task's difficulty is its hop count k (``KGSearchEnv.question(seed)["hops"]``)
and a curriculum is a function of the training iteration,

    w(it) = (w_1(it), ..., w_K(it)),   sum_k w_k(it) = 1,

the probability of drawing a task of the k-th hop count of ``hops`` at iteration ``it``. A task
seed is drawn in two steps: a hop count k ~ w(it), then a seed uniformly among the training seeds
whose question has k hops (``hop_pools``, ``sample_task_seeds``).

Schedules (``schedule``, a string):

- ``"uniform"``: w_k = 1/K at every iteration (the baseline: uniform hop sampling).
- ``"staged"``: the paper's staged curriculum, cumulative. The first ``ramp_frac`` of training is
  cut into K equal stages; in stage s (0-based) the tasks are uniform over the s + 1 easiest hop
  counts, so easy tasks stay in the mix (no forgetting of the first stage); after the ramp, uniform
  over all (so the curriculum arm ends on the baseline's distribution).
- ``"linear"``: a smooth ramp, w(it) = (1 - f) onehot(hops[0]) + f uniform, f = min(1, it / (ramp_frac
  num_iters)).

Inferred, not from the paper: the number of stages (one per hop count), their equal length, the
cumulative mixing of easier stages, and ending on the uniform mixture. The paper's stages are
defined by question structure and its second stage by long-horizon tasks; here hop count is the one
difficulty axis of ``KGSearchEnv``.

Plugging in: ``agent_pg.train(make_env, policy, cfg, train_seeds=seed_fn)`` takes
``seed_fn(it, rng, n) -> (n,) seeds`` (``curriculum_seed_fn``) in place of a seed list; for the LM
loop ``lm_episode_sampler`` wraps ``grpo.episode_sampler`` so each round draws its seeds from the
schedule. ``collapse_events`` counts the evaluations at which a learning curve fell far below its
running peak (the "instability" the paper attributes to corrupted rewards).
"""

from __future__ import annotations

import numpy as np

SCHEDULES = ("uniform", "staged", "linear")


def hop_weights(it: int, num_iters: int, num_hops: int, schedule: str = "staged",
                ramp_frac: float = 0.6) -> np.ndarray:
    """(K,) probabilities over the K hop counts (easiest first) at iteration ``it`` (0-based) of
    ``num_iters``; the schedules are the module docstring's.

    >>> hop_weights(0, 10, 2, "staged", 1.0).tolist(), hop_weights(5, 10, 2, "staged", 1.0).tolist()
    ([1.0, 0.0], [0.5, 0.5])
    >>> hop_weights(2, 10, 3, "linear", 0.4).round(3).tolist()
    [0.667, 0.167, 0.167]
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if num_hops < 1 or num_iters < 1:
        raise ValueError(f"num_hops and num_iters must be >= 1, got {num_hops}, {num_iters}")
    if not 0.0 < ramp_frac <= 1.0:
        raise ValueError(f"ramp_frac must be in (0, 1], got {ramp_frac}")
    if it < 0:
        raise ValueError(f"it must be >= 0, got {it}")
    K = int(num_hops)
    uniform = np.full(K, 1.0 / K)  # (K,)
    ramp = ramp_frac * num_iters  # iterations of the ramp
    if schedule == "uniform" or it >= ramp:
        return uniform
    if schedule == "staged":
        stage = min(int(it * K // ramp), K - 1)  # stage s covers [s ramp / K, (s + 1) ramp / K)
        w = np.zeros(K)
        w[:stage + 1] = 1.0 / (stage + 1)
        return w
    f = it / ramp  # linear
    w = f * uniform
    w[0] += 1.0 - f
    return w


def hop_pools(hop_of, seeds) -> dict[int, np.ndarray]:
    """{hop count: the seeds (ascending) whose task has that many hops}; ``hop_of(seed) -> int``
    (e.g. ``lambda s: env.question(s)["hops"]``)."""
    pools: dict[int, list] = {}
    for s in seeds:
        pools.setdefault(int(hop_of(int(s))), []).append(int(s))
    if not pools:
        raise ValueError("hop_pools needs at least one seed")
    return {k: np.array(sorted(v)) for k, v in sorted(pools.items())}


def sample_task_seeds(rng: np.random.Generator, pools: dict[int, np.ndarray], hops,
                      weights: np.ndarray, n: int) -> np.ndarray:
    """(n,) task seeds: hop count k_i ~ ``weights`` over ``hops``, then a seed uniform in
    ``pools[k_i]`` (the draws: ``rng.choice`` of the hop indices, then one ``rng.integers`` per
    seed, in order)."""
    weights = np.asarray(weights, dtype=float)  # (K,)
    if len(weights) != len(hops):
        raise ValueError(f"{len(weights)} weights for {len(hops)} hop counts")
    if np.any(weights < 0) or not np.isclose(weights.sum(), 1.0):
        raise ValueError(f"weights must be a probability vector, got {weights.tolist()}")
    missing = [k for k, w in zip(hops, weights) if w > 0 and len(pools.get(k, ())) == 0]
    if missing:
        raise ValueError(f"no training seed has {missing} hops, but the schedule asks for them")
    ks = rng.choice(len(hops), size=int(n), p=weights)  # (n,) hop indices
    return np.array([pools[hops[k]][rng.integers(len(pools[hops[k]]))] for k in ks], dtype=int)


def curriculum_seed_fn(pools: dict[int, np.ndarray], hops, num_iters: int,
                       schedule: str = "staged", ramp_frac: float = 0.6, log: list | None = None):
    """``seed_fn(it, rng, n) -> (n,) seeds`` following ``hop_weights`` (what ``agent_pg.train``
    takes as ``train_seeds``). ``log``: if a list, each call appends (it, weights, hop counts)."""
    hops = [int(k) for k in hops]

    def seed_fn(it: int, rng: np.random.Generator, n: int) -> np.ndarray:
        w = hop_weights(it, num_iters, len(hops), schedule, ramp_frac)
        seeds = sample_task_seeds(rng, pools, hops, w, n)
        if log is not None:
            inv = {int(s): k for k, p in pools.items() for s in p}
            log.append((it, w, [inv[int(s)] for s in seeds]))
        return seeds
    return seed_fn


def lm_episode_sampler(tokenizer, make_env, seed_fn, cfg, system_prompt: str | None = None):
    """``grpo.episode_sampler`` whose round ``it`` plays the task seeds ``seed_fn(it, rng, n)``
    (n = ``cfg.num_prompts``, rng seeded by ``cfg.seed``): the inner sampler draws its seeds
    without replacement from a pool that holds exactly this round's n seeds, so it plays them all
    (in its own order); its token generator and turn-cap schedule are unchanged."""
    from agentrl_lib.algorithms import grpo

    rng = np.random.default_rng([int(cfg.seed), 7])
    pool = [int(s) for s in seed_fn(0, rng, cfg.num_prompts)]
    inner = grpo.episode_sampler(tokenizer, make_env, pool, cfg, system_prompt)

    def sample(model, it: int = 0):  # it: updates done (loop.run)
        if it > 0:  # round 0's seeds were drawn above
            pool[:] = [int(s) for s in seed_fn(it, rng, cfg.num_prompts)]
        batch = inner(model, it)
        batch.metrics["rollout/hops"] = float(np.mean([ep.infos[-1].get("hops", np.nan)
                                                       for ep in batch.episodes if ep.infos]))
        return batch
    return sample


def collapse_events(values, drop: float = 0.2) -> int:
    """How many evaluations of a learning curve sit more than ``drop`` below the best value seen
    so far (the running peak): 0 for a curve that never falls back that far.

    >>> collapse_events([0.1, 0.6, 0.3, 0.7, 0.65], drop=0.2)
    1
    """
    v = np.asarray(values, dtype=float)  # (E,)
    if v.size == 0:
        return 0
    peak = np.maximum.accumulate(v)  # (E,)
    return int(np.sum(v < peak - drop))
