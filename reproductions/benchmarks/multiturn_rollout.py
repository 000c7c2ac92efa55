"""Throughput of the batched multi-turn LM rollout against the naive one-episode-at-a-time loop.

Three ways to play the same episodes with the tiny LM on the text gridworld (GridAgentEnv):
- naive: one episode at a time, the whole conversation re-encoded every turn (``naive_rollout``);
- batched, re-encoded: all environments stepped together, one batched generation per turn, but the
  conversation re-encoded from its first token every turn (the cache thrown away between turns);
- batched + cache: ``lm_rollout``: all environments together and the KV cache kept across turns, so
  each turn feeds only the new observation tokens.

Run: ``.venv/bin/python reproductions/benchmarks/multiturn_rollout.py [--episodes 64] [--repeats 3]``.
Reports episodes/s and generated (agent) tokens/s, the ratio to naive, and where the time goes
(prefill = encoding prompt/observation tokens, decode = one-token generation steps, env.step,
tokenizer/template, and the rest: Python bookkeeping). Uses one torch thread.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

import torch

from agentrl_lib import rollout
from agentrl_lib.envs.multiturn import GridAgentEnv
from agentrl_lib.models.tiny_lm import new_model


def run(kind, model, tok, make_env, seeds, group_size, max_turns, max_new_tokens, seed):
    timers = {}
    gen = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    if kind == "naive":
        eps = rollout.naive_rollout(model, tok, make_env, seeds, group_size, max_turns,
                                    max_new_tokens, 1.0, gen, timers=timers)
    elif kind == "batched, re-encoded":
        envs, eps = rollout._new_episodes(make_env, seeds, group_size)
        rollout._play(model, tok, envs, eps, max_turns, max_new_tokens, 1.0, False, gen,
                      GridAgentEnv.system_prompt, reuse_cache=False, timers=timers)
    else:
        eps = rollout.lm_rollout(model, tok, make_env, seeds, group_size, max_turns,
                                 max_new_tokens, 1.0, gen, timers=timers)
    wall = time.perf_counter() - t0
    tokens = sum(sum(ep.loss_mask) for ep in eps)
    turns = sum(len(ep) for ep in eps)
    timers["python/other"] = wall - sum(timers.values())
    return dict(wall=wall, episodes=len(eps), tokens=tokens, turns=turns, timers=timers,
                context=max(len(ep.prompt_ids) + len(ep.token_ids) for ep in eps))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=64, help="episodes per measurement")
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-turns", type=int, default=6)
    ap.add_argument("--max-new-tokens", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repeats; the median is kept")
    ap.add_argument("--model", default="tiny-64", help="tiny_lm size (random init) or a checkpoint")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if os.path.isdir(args.model):
        from agentrl_lib.models.loading import load_policy
        model, tok = load_policy(args.model)
    else:
        model, tok = new_model(args.model, seed=0)
    model.eval()
    make_env = lambda: GridAgentEnv(layout=["...", ".#.", "..."], max_turns=args.max_turns)  # noqa: E731
    seeds = list(range(args.episodes // args.group_size))
    kinds = ["naive", "batched, re-encoded", "batched + cache"]
    print(f"load average before: {os.getloadavg()}; {platform.processor() or platform.machine()}; "
          f"torch {torch.__version__}, 1 thread")
    run("batched + cache", model, tok, make_env, seeds[:1], 2, 2, args.max_new_tokens, 0)  # warm-up
    results = {k: [] for k in kinds}
    for r in range(args.repeats):
        for k in kinds:
            results[k].append(run(k, model, tok, make_env, seeds, args.group_size, args.max_turns,
                                  args.max_new_tokens, seed=r))
    med = {}
    for k in kinds:
        rs = sorted(results[k], key=lambda x: x["wall"])
        med[k] = rs[len(rs) // 2]
    base = med["naive"]
    print(f"\n{len(seeds) * args.group_size} episodes, {args.max_turns} turns max, "
          f"{args.max_new_tokens} tokens per action max; median of {args.repeats}")
    print(f"{'':22} {'wall s':>8} {'episodes/s':>11} {'tokens/s':>9} {'x naive':>8}   where the time goes")
    for k in kinds:
        m = med[k]
        tps = m["tokens"] / m["wall"]
        share = ", ".join(f"{n} {v / m['wall']:.0%}" for n, v in sorted(m["timers"].items()))
        print(f"{k:22} {m['wall']:8.2f} {m['episodes'] / m['wall']:11.2f} {tps:9.1f} "
              f"{tps / (base['tokens'] / base['wall']):8.2f}   {share}")
    print(f"\ngenerated tokens per run: {[med[k]['tokens'] for k in kinds]}, turns "
          f"{[med[k]['turns'] for k in kinds]}, longest conversation {med['naive']['context']} tokens")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
