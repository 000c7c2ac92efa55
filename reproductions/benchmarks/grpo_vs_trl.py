"""Benchmark: our GRPO loop (``agentrl_lib.algorithms.grpo.train``) against TRL's ``GRPOTrainer`` on
the same model, task, reward, batch and hyperparameters (mapped by ``trl_adapter.to_trl_config``).

    .venv/bin/python reproductions/benchmarks/grpo_vs_trl.py --steps 60 --target-acc 0.55 --seed 0 \
        --out /tmp/grpo_vs_trl.json [--base agentrl-sft/<name> | --base <checkpoint folder>]

Each implementation runs in its own child process (so its peak memory is its own), one after the
other; ``--repeats`` alternates them (ours, TRL, ours, TRL, ...) so slow drifts of machine load hit
both. Reported per implementation:

- steps/s and generated tokens/s over the training steps, with the held-out evaluations taken out
  of the wall time (both sides evaluate the same panel at the same steps, with the same function);
- peak memory: the child's ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` (resident set high-water
  mark, imports included) and its growth during training (maxrss at the end minus maxrss just
  before training starts); on CUDA also ``torch.cuda.max_memory_allocated``;
- wall time to reach ``--target-acc`` greedy accuracy on the held-out panel (the first evaluation
  at or above it; evaluations every ``--eval-every`` steps, so this is resolved to that grid);
- ``--deterministic`` runs both under ``torch.use_deterministic_algorithms(True)`` (what agentrl's
  ``set_seed`` turns on, and so what the notebooks run under); in that mode ``torch.empty`` fills
  new memory with NaN, which costs TRL's CPU log-prob kernel a 512 MiB fill per call;
- where the time goes: ours from its own per-step timers (generation vs the rest) and, with
  ``--profile-steps N``, a cProfile run of N more steps of each (no evaluation) whose cumulative
  times are split into generation / training forward / backward / optimizer / reward / other.

The ratios printed are ours / TRL (below 1: ours is faster or smaller).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=60, help="optimizer steps (generation rounds)")
    p.add_argument("--target-acc", type=float, default=0.55,
                   help="held-out greedy accuracy whose first crossing is timed")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=str, default="", help="write the results JSON here")
    p.add_argument("--model", "--base", dest="model", type=str, default="agentrl-sft/chain-mix-tiny",
                   help="the start model of both sides: a named SFT base (agentrl-sft/<name>), a "
                   "checkpoint folder (e.g. the bpe chain-mix base) or anything load_policy takes; "
                   "its own tokenizer is used on both sides")
    p.add_argument("--task", type=str, default="chain", help="text task (text_tasks.GENERATORS)")
    p.add_argument("--device", type=str, default="cpu")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=40)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--beta", type=float, default=0.04)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--difficulty", type=int, default=3)
    p.add_argument("--train-size", type=int, default=4000)
    p.add_argument("--eval-size", type=int, default=500)
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads in each child")
    p.add_argument("--repeats", type=int, default=1, help="alternating runs of each implementation")
    p.add_argument("--profile-steps", type=int, default=10,
                   help="steps of an extra cProfile run per implementation (0: none)")
    p.add_argument("--deterministic", action="store_true",
                   help="torch.use_deterministic_algorithms(True), as agentrl's set_seed does by "
                        "default (then torch.empty fills new memory with NaN)")
    p.add_argument("--trl-logprob-chunk", type=int, default=0,
                   help="if > 0, set TRL's vocabulary tile of its chunked log-prob kernel "
                        "(trl.trainer.utils._CHUNKED_LOGPROB_CHUNK_SIZE, 32768 in TRL 1.16)")
    p.add_argument("--worker", choices=["ours", "trl"], default=None, help=argparse.SUPPRESS)
    p.add_argument("--profile", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--worker-out", type=str, default="", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


# --------------------------------------------------------------------------------------------------
# worker: one implementation in this process
# --------------------------------------------------------------------------------------------------
def load(model_name: str, device: str):
    from agentrl_lib.algorithms.sft import load_base

    model, tok = load_base(model_name, device=device)
    probe = tok.apply_chat_template([{"role": "user", "content": "12+7="}],
                                    add_generation_prompt=True, tokenize=False)
    ids = tok(probe, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == probe, "the tokenizer does not round-trip the chat template"
    return model.eval(), tok


def build(args):
    import torch

    from agentrl_lib.algorithms.grpo import GRPOConfig
    from agentrl_lib.envs.text_tasks import eval_panel, make_problems
    from agentrl_lib.utils import set_seed

    torch.set_num_threads(args.threads)
    set_seed(args.seed, deterministic=args.deterministic)
    model, tok = load(args.model, args.device)
    train = make_problems(args.task, args.train_size, args.difficulty, "train", seed=args.seed)
    panel, panel_hash = eval_panel(args.task, args.eval_size, args.difficulty)
    cfg = GRPOConfig(estimator="grpo", loss_agg="seq_mean", beta=args.beta, clip_eps=0.2,
                     num_prompts=args.num_prompts, group_size=args.group_size,
                     num_iters=args.steps, num_epochs=1, lr=args.lr,
                     max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                     eval_every=args.eval_every, seed=args.seed)
    return model, tok, train, panel, panel_hash, cfg


def run_ours(args, model, tok, train, panel, cfg, reward, evaluate):
    import copy

    from agentrl_lib.algorithms import grpo

    ref = copy.deepcopy(model).eval() if cfg.beta else None
    evals = []

    def timed_eval(m):  # the evaluation's time is taken out of the training time
        t = time.perf_counter()
        out = evaluate(m)
        evals.append((t, time.perf_counter() - t))
        return out

    t0 = time.perf_counter()
    rows = grpo.train(model, grpo.completion_sampler(tok, train, [reward], cfg), cfg,
                      evaluate=timed_eval, ref_model=ref)
    wall = time.perf_counter() - t0
    eval_total = sum(d for _, d in evals)
    curve, spent = [], 0.0
    for r, (t, d) in zip([r for r in rows if "eval/acc" in r], evals):
        curve.append({"iter": r["iter"], "acc": r["eval/acc"], "train_s": t - t0 - spent})
        spent += d
    train_rows = [r for r in rows if "rollout/reward" in r]
    tokens = sum(r["rollout/completion_len"] * cfg.num_prompts * cfg.group_size for r in train_rows)
    gen = sum(r["time/gen_s"] for r in train_rows)
    step = sum(r["time/step_s"] for r in train_rows)
    return {"wall_s": wall, "train_s": wall - eval_total, "eval_s": eval_total, "curve": curve,
            "gen_tokens": tokens, "reward": [r["rollout/reward"] for r in train_rows],
            "timers": {"generation (rollout.generate)": gen,
                       "score + advantages + ref/train forward + backward + optimizer": step - gen,
                       "between steps (loop, logging)": wall - eval_total - step}}


def run_trl(args, model, tok, train, panel, cfg, reward, evaluate):
    from agentrl_lib.algorithms import trl_adapter

    cb = trl_adapter.HeldOutEval(evaluate, cfg.eval_every)
    t_init = time.perf_counter()
    trainer = trl_adapter.make_trainer(model, tok, train, [reward], cfg, tempfile.mkdtemp(),
                                       device=args.device, callbacks=[cb])
    init_s = time.perf_counter() - t_init
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    eval_total = sum(r["time/eval_s"] for r in cb.rows)
    logs = [h for h in trainer.state.log_history if "reward" in h]
    tokens = sum(h["completions/mean_length"] * cfg.num_prompts * cfg.group_size for h in logs)
    return {"wall_s": wall, "train_s": wall - eval_total, "eval_s": eval_total, "init_s": init_s,
            "curve": [{"iter": r["iter"], "acc": r["eval/acc"], "train_s": r["time/train_s"]}
                      for r in cb.rows],
            "gen_tokens": tokens, "reward": [h["reward"] for h in logs],
            "timers": {"step_time (TRL's own, summed)": sum(h.get("step_time", 0.0) for h in logs)}}


# cumulative-time buckets for the cProfile breakdown: (label, [(file suffix, function name)])
BUCKETS = {
    "ours": [
        ("generation", [("agentrl_lib/rollout.py", "generate")]),
        ("train forward (logps, ref logps)", [("agentrl_lib/rollout.py", "sequence_logps")]),
        ("backward", [("torch/_tensor.py", "backward")]),
        ("optimizer (AdamW + grad clip)", [("torch/optim/optimizer.py", "wrapper"),
                                           ("torch/nn/utils/clip_grad.py", "_no_grad_wrapper")]),
        ("reward + advantages", [("agentrl_lib/algorithms/grpo.py", "score"),
                                 ("agentrl_lib/algorithms/grpo.py", "advantages")]),
    ],
    "trl": [
        ("generation", [("transformers/generation/utils.py", "generate")]),
        ("train forward (logps, ref logps)", [("trl/trainer/grpo_trainer.py",
                                               "_get_per_token_logps_and_entropies")]),
        ("backward", [("torch/_tensor.py", "backward")]),
        ("optimizer (AdamW + grad clip)", [("torch/optim/optimizer.py", "wrapper"),
                                           ("accelerate/accelerator.py", "clip_grad_norm_")]),
        ("reward + advantages", [("trl/trainer/grpo_trainer.py", "_calculate_rewards")]),
    ],
}
TOTAL = {"ours": ("agentrl_lib/algorithms/grpo.py", "train"),
         "trl": ("transformers/trainer.py", "train")}


def profile_breakdown(impl, args, model, tok, train, cfg, reward):
    """cProfile ``args.profile_steps`` training steps (no evaluation); cumulative seconds per bucket
    and the top entries by cumulative time."""
    import cProfile
    import copy
    import pstats
    from dataclasses import replace

    from agentrl_lib.algorithms import grpo, trl_adapter

    cfg = replace(cfg, num_iters=args.profile_steps, eval_every=10**9)
    prof = cProfile.Profile()
    if impl == "ours":
        ref = copy.deepcopy(model).eval() if cfg.beta else None
        prof.enable()
        grpo.train(model, grpo.completion_sampler(tok, train, [reward], cfg), cfg, ref_model=ref)
        prof.disable()
    else:
        trainer = trl_adapter.make_trainer(model, tok, train, [reward], cfg, tempfile.mkdtemp(),
                                           device=args.device)
        prof.enable()
        trainer.train()
        prof.disable()
    st = pstats.Stats(prof)

    def cum(suffix, name):
        return sum(v[3] for (f, _, fn), v in st.stats.items() if f.endswith(suffix) and fn == name)

    total = cum(*TOTAL[impl])
    parts = {label: sum(cum(*k) for k in keys) for label, keys in BUCKETS[impl]}
    parts["other (framework, data, logging)"] = total - sum(parts.values())
    top = sorted(((v[3], f"{Path(f).parent.name}/{Path(f).name}:{fn}") for (f, _, fn), v
                  in st.stats.items()), reverse=True)[:25]
    return {"steps": args.profile_steps, "total_s": total, "parts_s": parts,
            "top_cumulative": [(round(t, 3), name) for t, name in top]}


def worker(args):
    import torch

    from agentrl_lib.algorithms import grpo
    from agentrl_lib.rewards import correctness_reward

    t_start = time.perf_counter()
    if args.worker == "trl":
        import trl  # noqa: F401  (counted in the import time and memory of this side)

        if args.trl_logprob_chunk > 0:
            import trl.trainer.utils as trl_utils

            trl_utils._CHUNKED_LOGPROB_CHUNK_SIZE = args.trl_logprob_chunk
    model, tok, train, panel, panel_hash, cfg = build(args)
    setup_s = time.perf_counter() - t_start

    def evaluate(m):
        return grpo.evaluate(m, tok, panel, correctness_reward, cfg.max_new_tokens)

    if args.profile:
        out = profile_breakdown(args.worker, args, model, tok, train, cfg, correctness_reward)
    else:
        rss_before = maxrss_mib()
        if args.device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        run = run_ours if args.worker == "ours" else run_trl
        out = run(args, model, tok, train, panel, cfg, correctness_reward, evaluate)
        out.update(maxrss_mib=maxrss_mib(), maxrss_growth_mib=maxrss_mib() - rss_before,
                   setup_s=setup_s, panel_hash=panel_hash, steps=cfg.num_iters)
        if args.device.startswith("cuda"):
            out["cuda_peak_mib"] = torch.cuda.max_memory_allocated() / 2**20
    out["loadavg"] = os.getloadavg()
    Path(args.worker_out).write_text(json.dumps(out))


# --------------------------------------------------------------------------------------------------
# driver
# --------------------------------------------------------------------------------------------------
def child(impl: str, argv: list[str], profile: bool = False) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    cmd = [sys.executable, __file__, *argv, "--worker", impl, "--worker-out", path]
    if profile:
        cmd.append("--profile")
    load_before = os.getloadavg()
    t = time.perf_counter()
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"{impl} worker failed:\n{res.stderr[-4000:]}")
    out = json.loads(Path(path).read_text())
    out["process_s"] = time.perf_counter() - t
    out["loadavg_before"] = load_before
    return out


def time_to(curve: list[dict], target: float) -> tuple[float | None, int | None]:
    for r in curve:
        if r["acc"] >= target:
            return r["train_s"], r["iter"]
    return None, None


def summarise(runs: list[dict], target: float) -> dict:
    import statistics as stats

    def med(xs):
        xs = [x for x in xs if x is not None]
        return stats.median(xs) if xs else None

    out = {}
    out["steps_per_s"] = med([r["steps"] / r["train_s"] for r in runs])
    out["gen_tokens_per_s"] = med([r["gen_tokens"] / r["train_s"] for r in runs])
    out["train_s"] = med([r["train_s"] for r in runs])
    out["maxrss_mib"] = med([r["maxrss_mib"] for r in runs])
    out["maxrss_growth_mib"] = med([r["maxrss_growth_mib"] for r in runs])
    if "cuda_peak_mib" in runs[0]:
        out["cuda_peak_mib"] = med([r["cuda_peak_mib"] for r in runs])
    hits = [time_to(r["curve"], target) for r in runs]
    out["time_to_target_s"] = med([h[0] for h in hits])
    out["step_to_target"] = med([h[1] for h in hits])
    out["reached"] = sum(h[0] is not None for h in hits)
    out["final_acc"] = med([r["curve"][-1]["acc"] for r in runs])
    out["start_acc"] = runs[0]["curve"][0]["acc"]
    out["setup_s"] = med([r["setup_s"] + r.get("init_s", 0.0) for r in runs])
    return out


def fmt(x, nd=3):
    return "n/a" if x is None else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    passthrough = [a for a in (argv if argv is not None else sys.argv[1:])]
    skip = {"--out", "--repeats"}
    fwd, i = [], 0
    while i < len(passthrough):  # forward every option except the driver's own
        if passthrough[i].split("=")[0] in skip:
            i += 1 if "=" in passthrough[i] else 2
            continue
        fwd.append(passthrough[i])
        i += 1
    runs = {"ours": [], "trl": []}
    for rep in range(args.repeats):
        for impl in ("ours", "trl"):
            print(f"[repeat {rep}] running {impl} ...", flush=True)
            runs[impl].append(child(impl, fwd))
    profiles = {}
    if args.profile_steps > 0:
        for impl in ("ours", "trl"):
            print(f"profiling {impl} for {args.profile_steps} steps ...", flush=True)
            profiles[impl] = child(impl, fwd, profile=True)
    summ = {impl: summarise(r, args.target_acc) for impl, r in runs.items()}

    rows = [("steps/s", "steps_per_s"), ("generated tokens/s", "gen_tokens_per_s"),
            ("train wall time, s (evals excluded)", "train_s"),
            ("peak RSS of the process, MiB", "maxrss_mib"),
            ("RSS growth during training, MiB", "maxrss_growth_mib")]
    if "cuda_peak_mib" in summ["ours"]:
        rows.append(("CUDA peak allocated, MiB", "cuda_peak_mib"))
    rows += [(f"wall time to acc >= {args.target_acc}, s", "time_to_target_s"),
             ("step of that evaluation", "step_to_target"),
             ("held-out acc at step 0", "start_acc"),
             (f"held-out acc at step {args.steps}", "final_acc"),
             ("setup (imports, load, trainer init), s", "setup_s")]
    lines = [f"| metric | ours | TRL | ours / TRL |", "|---|---|---|---|"]
    for label, key in rows:
        o, t = summ["ours"][key], summ["trl"][key]
        ratio = o / t if (o is not None and t not in (None, 0)) else None
        lines.append(f"| {label} | {fmt(o)} | {fmt(t)} | {fmt(ratio)} |")
    table = "\n".join(lines)
    print()
    print(table)
    curve_lines = ["| step | " + " | ".join(f"ours r{i}" for i in range(args.repeats)) + " | "
                   + " | ".join(f"TRL r{i}" for i in range(args.repeats)) + " |",
                   "|---" * (1 + 2 * args.repeats) + "|"]
    for j, r0 in enumerate(runs["ours"][0]["curve"]):
        vals = [f"{r['curve'][j]['acc']:.3f}" for r in runs["ours"]]
        vals += [f"{r['curve'][j]['acc']:.3f}" for r in runs["trl"]]
        curve_lines.append(f"| {r0['iter']} | " + " | ".join(vals) + " |")
    print()
    print("\n".join(curve_lines))
    for impl, p in profiles.items():
        print(f"\nwhere the time goes, {impl} (cProfile, {p['steps']} steps, "
              f"total {p['total_s']:.2f} s):")
        for label, s in p["parts_s"].items():
            print(f"  {label:40s} {s:7.2f} s  {100 * s / p['total_s']:5.1f}%")
    for impl in ("ours", "trl"):
        print(f"\nown timers, {impl} (repeat 0):",
              {k: round(v, 2) for k, v in runs[impl][0]["timers"].items()})
    verdict = None
    o, t = summ["ours"]["time_to_target_s"], summ["trl"]["time_to_target_s"]
    if o is not None and t is not None:
        verdict = o <= 0.5 * t
        print(f"\ntarget 'ours reaches acc {args.target_acc} in at most half of TRL's wall time': "
              f"{'MET' if verdict else 'NOT MET'} (ratio {o / t:.3f})")
    else:
        print(f"\ntarget accuracy {args.target_acc} not reached by "
              f"{'ours' if o is None else ''}{' and ' if o is None and t is None else ''}"
              f"{'TRL' if t is None else ''} within {args.steps} steps")
    internal = ("worker", "worker_out", "profile")
    result = {"args": {k: v for k, v in vars(args).items() if k not in internal},
              "summary": summ, "runs": runs, "profiles": profiles, "table": table,
              "target_met": verdict,
              "machine": {"cpus": os.cpu_count(), "loadavg_end": os.getloadavg()}}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
        print("wrote", args.out)
    return result


if __name__ == "__main__":
    main()
