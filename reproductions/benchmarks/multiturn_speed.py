"""Issue 26 (3): the multi-turn LM loop, today's substrate against the new one, side by side.

*Today* is the character tokenizer and the library as it was at commit ``--today`` (0856ce9: before
issue 26), materialised with ``git archive`` into a temporary folder and run in a child process
with ``PYTHONPATH`` pointing there. *New* is the BPE tokenizer (``tiny_lm.load_tokenizer('bpe')``)
and this checkout's library, also in a child process. Both play the same environment (the text
gridworld ``GridAgentEnv``, ``--layout``, ``--max-turns``) from the same task seeds with the same
sampling seeds; each side's token budget per action is its tokenizer's longest valid move + the
end-of-turn token (6 for characters: 'right' + eos, as notebooks 30-31 use).

Two parts, one run each (``--repeats`` interleaved: today, new, today, new, ...; medians kept):

- ``rollout`` (target (b)): episodes/s of ``rollout.lm_rollout`` (all environments stepped together
  on a KV cache kept across turns), today vs new (target >= 4x), and on the new substrate the
  batched rollout vs ``rollout.naive_rollout`` (one episode at a time, the conversation re-encoded
  every turn; target >= 5x);
- ``update`` (target (c)): one full update of the multi-turn loop, ``grpo.episode_sampler`` (the
  rollout) + ``grpo.advantages`` + ``grpo.update`` (forward, backward, AdamW), today vs new
  (target >= 3x).

Models: random-init tiny-64 of each tokenizer unless ``--base-today`` / ``--base`` name an SFT base
(``sft.load_base``: ``agentrl-sft/<name>`` or a checkpoint folder). A random-init model writes no
valid move, so every episode runs all ``--max-turns`` turns with the longer error observation; an
SFT base ends episodes at the goal. One torch thread in each child (as the notebooks on CPU).

    .venv/bin/python reproductions/benchmarks/multiturn_speed.py rollout
    .venv/bin/python reproductions/benchmarks/multiturn_speed.py update
    .venv/bin/python reproductions/benchmarks/multiturn_speed.py update \\
        --base-today agentrl-sft/grid5-agent-tiny --base agentrl-sft/grid5-agent-bpe
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GRID5 = ".....|.#.#.|.....|..#..|....."


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("part", choices=["rollout", "update"])
    p.add_argument("--today", default="0856ce9", help="the commit whose library is 'today'")
    p.add_argument("--base-today", default="", help="today's model: an SFT base (char tokenizer); "
                   "'' = random-init tiny-64")
    p.add_argument("--base", default="", help="the new model: an SFT base (bpe tokenizer); "
                   "'' = random-init tiny-64 with the bpe tokenizer")
    p.add_argument("--tokenizer", default="bpe", help="the new side's tokenizer (load_tokenizer)")
    p.add_argument("--today-tokenizer", default="char",
                   help="today's side: 'char' (today's substrate) or 'bpe' (this checkout's BPE "
                   "files on today's library: the loop's share alone)")
    p.add_argument("--layout", default=GRID5, help="grid rows separated by '|' (notebook 31's)")
    p.add_argument("--max-turns", type=int, default=10, help="turn cap (notebook 31's grid: 10)")
    p.add_argument("--seeds", type=int, default=None,
                   help="task seeds (groups); default 8 for rollout, 4 for update (notebook 30's)")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats; medians kept")
    p.add_argument("--worker", choices=["today", "new"], default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker-out", default="", help=argparse.SUPPRESS)
    p.add_argument("--rep", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.seeds is None:
        args.seeds = 8 if args.part == "rollout" else 4
    return args


# --------------------------------------------------------------------------------------------------
# worker: one side in this process (runs on today's library as well as on this one)
# --------------------------------------------------------------------------------------------------
def load_side(args):
    from agentrl_lib.models import tiny_lm

    base = args.base_today if args.worker == "today" else args.base
    if base:
        from agentrl_lib.algorithms.sft import load_base

        model, tok = load_base(base, verbose=False)
    elif args.worker == "today" and args.today_tokenizer == "bpe":
        import importlib.util

        spec = importlib.util.spec_from_file_location(
            "tiny_lm_new", ROOT / "agentrl_lib" / "models" / "tiny_lm.py")
        new = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(new)  # only transformers and tokenizers: no agentrl_lib import
        model, tok = tiny_lm.new_model("tiny-64", seed=0, tokenizer=new.load_tokenizer("bpe"))
    elif args.worker == "today":
        model, tok = tiny_lm.new_model("tiny-64", seed=0)
    else:
        model, tok = tiny_lm.new_model("tiny-64", seed=0, tokenizer=args.tokenizer)
    return model.eval(), tok


def timed_rollout(kind, model, tok, make_env, seeds, args, budget, rep):
    import torch

    from agentrl_lib import rollout

    fn = rollout.lm_rollout if kind == "batched + cache" else rollout.naive_rollout
    timers = {}
    t0 = time.perf_counter()
    eps = fn(model, tok, make_env, seeds, args.group_size, args.max_turns, budget, 1.0,
             torch.Generator().manual_seed(rep), timers=timers)
    wall = time.perf_counter() - t0
    timers["python/other"] = wall - sum(timers.values())
    return dict(wall=wall, episodes=len(eps), turns=sum(len(e) for e in eps), timers=timers,
                tokens=sum(len(e.prompt_ids) + len(e.token_ids) for e in eps),
                agent_tokens=sum(sum(e.loss_mask) for e in eps),
                success=sum(e.success for e in eps) / len(eps))


def timed_update(model, tok, make_env, seeds, args, budget, rep):
    import copy

    import torch

    from agentrl_lib.algorithms import grpo
    from agentrl_lib.algorithms.grpo import GRPOConfig

    cfg = GRPOConfig(num_prompts=len(seeds), group_size=args.group_size, max_turns=args.max_turns,
                     max_new_tokens=budget, lr=3e-4, loss_agg="token_mean", seed=rep)
    timers = TIMERS
    timers.clear()
    policy = copy.deepcopy(model)
    opt = torch.optim.AdamW(policy.parameters(), lr=cfg.lr, weight_decay=0.0)
    sample = grpo.episode_sampler(tok, make_env, list(range(10_000)), cfg)
    t0 = time.perf_counter()
    batch = sample(policy, 0)
    t1 = time.perf_counter()
    batch = grpo.advantages(batch, cfg)
    t2 = time.perf_counter()
    grpo.update(policy, opt, batch, cfg)
    t3 = time.perf_counter()
    parts = {"rollout": t1 - t0, "advantages": t2 - t1, "update": t3 - t2}
    g = batch.seqs
    return dict(wall=t3 - t0, parts=parts, timers=timers, rows=g.completion_ids.shape[0],
                padded=list(g.prompt_ids.shape[1:]) + list(g.completion_ids.shape[1:]),
                tokens=int(g.prompt_mask.sum() + g.completion_mask.sum()),
                agent_tokens=int(g.loss_mask.sum()))


TIMERS: dict = {}
"""seconds per phase of the update being timed (``time_phases`` fills it)"""


def time_phases():
    """Wrap the functions ``grpo`` calls by their module-level names, once: the rollout gets
    ``TIMERS`` (prefill, decode, env, tokenizer), the training forward and the optimizer step
    (backward, clipping, AdamW) are timed."""
    from agentrl_lib.algorithms import grpo

    def timed(fn, key):
        def inner(*a, **k):
            t = time.perf_counter()
            out = fn(*a, **k)
            TIMERS[key] = TIMERS.get(key, 0.0) + time.perf_counter() - t
            return out
        return inner
    grpo.generation_logps = timed(grpo.generation_logps, "update: forward")
    grpo.optimizer_step = timed(grpo.optimizer_step, "update: backward + AdamW")
    roll = grpo.lm_rollout
    grpo.lm_rollout = lambda *a, **k: roll(*a, timers=TIMERS, **k)


def worker(args):
    import torch

    from agentrl_lib import rollout
    from agentrl_lib.envs.multiturn import GridAgentEnv

    torch.set_num_threads(1)
    model, tok = load_side(args)
    layout = args.layout.split("|")

    def make_env():
        return GridAgentEnv(layout=layout, max_turns=args.max_turns)
    budget = max(len(rollout.token_ids(tok, a)) for a in make_env().actions) + 1
    seeds = list(range(args.seeds))
    out = {"budget": budget, "vocab": len(tok)}
    if args.part == "rollout":
        kinds = ["batched + cache"] + (["one episode at a time"] if args.worker == "new" else [])
        rollout.lm_rollout(model, tok, make_env, seeds[:1], 2, 2, budget)  # warm-up
        out["runs"] = {k: timed_rollout(k, model, tok, make_env, seeds, args, budget, args.rep)
                       for k in kinds}
    else:
        time_phases()
        small = argparse.Namespace(**{**vars(args), "group_size": 2, "max_turns": 2})
        timed_update(model, tok, make_env, seeds[:1], small, budget, 99)  # warm-up
        out["runs"] = {"update": timed_update(model, tok, make_env, seeds, args, budget, args.rep)}
    Path(args.worker_out).write_text(json.dumps(out))


# --------------------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------------------
def child(side: str, argv: list[str], today_lib: str, rep: int) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    env = dict(os.environ, PYTHONPATH=today_lib if side == "today" else str(ROOT))
    cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--worker", side,
           "--worker-out", path, "--rep", str(rep)]
    res = subprocess.run(cmd, cwd=ROOT if side == "new" else today_lib, env=env,
                         capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{side} worker failed:\n{res.stderr[-4000:]}")
    return json.loads(Path(path).read_text())


def median_run(runs: list[dict]) -> dict:
    return sorted(runs, key=lambda r: r["wall"])[len(runs) // 2]


def shares(run: dict, keys=("timers",)) -> str:
    d = {k: v for key in keys for k, v in run[key].items()}
    top = sorted(d.items(), key=lambda x: -x[1])
    return ", ".join(f"{k} {v / run['wall']:.0%}" for k, v in top)


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    argv = list(argv if argv is not None else sys.argv[1:])
    today_lib = tempfile.mkdtemp(prefix="agentrl-today-")
    subprocess.run(f"git -C {ROOT} archive {args.today} agentrl_lib | tar -x -C {today_lib}",
                   shell=True, check=True)
    print(f"today: {args.today} ({args.today_tokenizer} tokenizer, "
          f"{args.base_today or 'random-init tiny-64'}); "
          f"new: this checkout ({args.tokenizer} tokenizer, {args.base or 'random-init tiny-64'})")
    print(f"uptime before: {uptime()}", flush=True)
    t_start = time.perf_counter()
    res = {"today": [], "new": []}
    for rep in range(args.repeats):
        for side in ("today", "new"):
            res[side].append(child(side, argv, today_lib, rep))
            print(f"  repeat {rep} {side}: " + ", ".join(
                f"{k} {r['wall']:.2f} s" for k, r in res[side][-1]["runs"].items()), flush=True)
    med = {side: {k: median_run([o["runs"][k] for o in outs]) for k in outs[0]["runs"]}
           for side, outs in res.items()}
    budgets = {side: outs[0]["budget"] for side, outs in res.items()}
    print(f"\n{args.seeds} task seeds x {args.group_size}, layout {args.layout}, at most "
          f"{args.max_turns} turns; tokens per action: today {budgets['today']}, "
          f"new {budgets['new']}; medians of {args.repeats} interleaved repeats")
    if args.part == "rollout":
        rows = [("today, batched + cache", med["today"]["batched + cache"]),
                ("new, batched + cache", med["new"]["batched + cache"]),
                ("new, one episode at a time", med["new"]["one episode at a time"])]
        print("| | wall s | episodes/s | tokens per episode | turns | success | "
              "where the time goes |")
        print("|---|---|---|---|---|---|---|")
        for name, r in rows:
            print(f"| {name} | {r['wall']:.2f} | {r['episodes'] / r['wall']:.1f} | "
                  f"{r['tokens'] / r['episodes']:.0f} | {r['turns']} | {r['success']:.2f} | "
                  f"{shares(r)} |")
        eps = {name: r["episodes"] / r["wall"] for name, r in rows}
        r1 = eps["new, batched + cache"] / eps["today, batched + cache"]
        r2 = eps["new, batched + cache"] / eps["new, one episode at a time"]
        print(f"\n(b) new / today episodes/s: {r1:.2f}x "
              f"(target >= 4x: {'MET' if r1 >= 4 else 'NOT MET'})")
        print(f"(b) new batched + cache / one episode at a time: {r2:.2f}x "
              f"(target >= 5x: {'MET' if r2 >= 5 else 'NOT MET'})")
    else:
        print("| | wall s | rollout s | advantages s | update s | rows x padded length (prompt, "
              "conversation) | real tokens | where the time goes |")
        print("|---|---|---|---|---|---|---|---|")
        for side in ("today", "new"):
            r = med[side]["update"]
            p = r["parts"]
            split = dict(r["timers"], advantages=p["advantages"])
            split["rollout: other"] = p["rollout"] - sum(v for k, v in r["timers"].items()
                                                         if not k.startswith("update"))
            split["update: other"] = p["update"] - sum(v for k, v in r["timers"].items()
                                                       if k.startswith("update"))
            print(f"| {side} | {r['wall']:.2f} | {p['rollout']:.2f} | {p['advantages']:.3f} | "
                  f"{p['update']:.2f} | {r['rows']} x {r['padded']} | {r['tokens']} | "
                  f"{shares(dict(r, timers=split))} |")
        ratio = med["today"]["update"]["wall"] / med["new"]["update"]["wall"]
        print(f"\n(c) one full update, today / new wall time: {ratio:.2f}x "
              f"(target >= 3x: {'MET' if ratio >= 3 else 'NOT MET'})")
    print(f"\nuptime after: {uptime()}; benchmark wall {time.perf_counter() - t_start:.0f} s")


if __name__ == "__main__":
    main()
