"""The GPU path in one prepared command (issue 31): ``make gpu-check``.

On a CUDA machine, one stage after another, each within a wall-clock budget that this script
enforces and reports (``PRESETS``; the whole run ends inside ``total_s``, 6 minutes on the GPU):

1. **setup**: the device named (model, memory, driver, torch, CUDA); the wheels of ``make
   gpu-wheels`` (``.gpu-wheels/``) installed offline (``pip --no-index``) into a temporary folder
   put on ``sys.path`` and on the notebooks' ``PYTHONPATH``; every package a stage needs imported,
   and one line ``MISSING: ...`` when something is not there (the stages that need it are skipped).
2. **pretrain**: ``sft.BASE_MODELS["pretrain-medium"]`` at a budget: its corpora, model, batch, lr
   and schedule, ``docs_per_corpus`` documents of each corpus, and as many steps as fit the stage's
   budget at the speed a short probe measured (at most the recipe's 4000); built by
   ``sft.checkpoint`` (the cache's own path); the loss curve written. The full recipe's training
   time on this device is extrapolated from the same probe.
3. **base**: ``chain-mix-medium`` from that checkpoint (the recipe's settings, its steps capped
   the same way), the start of notebook 11.
4. **rl**: our GRPO loop and TRL's ``GRPOTrainer`` on that base, same batch and hyperparameters
   (``reproductions/benchmarks/grpo_vs_trl.py``'s ``run_ours`` / ``run_trl``): generated tokens/s,
   updates/s, peak GPU memory; then a few updates of each under ``torch.profiler``: the fraction
   of the loop's wall time some kernel runs on the GPU (``trace_breakdown``), split into generation
   and the update, with the host-device copies and the host's waits on the GPU.
5. **nb11**, **nb30**: ``agentrl run`` of notebook 11 (GRPO vs TRL) and notebook 30 (multi-turn
   agent) in their ``gpu`` profile, from the checkpoints just built, with shorter budgets
   (``PRESETS[...]["notebooks"]``); their ``results.json`` are copied out.

Throughout, NVML (``pynvml``, when present) is sampled every 0.2 s: the GPU's utilisation and
the memory used on the device (all processes: the notebooks' kernels too), per stage.

Output, at most eight small files in ``$OUT`` (or ``--out``, default ``./gpu-out``), rewritten
after every stage so a killed run still leaves what it measured: ``gpu_check.md`` (the tables),
``gpu_check.json`` (every number), ``loss_curves.csv``, ``nb11_results.json``,
``nb30_results.json``, ``gpu_check.log``.

    python3 reproductions/gpu/gpu_check.py                 # on the GPU machine (make gpu-check)
    python3 reproductions/gpu/gpu_check.py --device cpu    # the CPU rehearsal: tiny sizes, no
                                                           # install (tests/test_gpu_check.py)

The rehearsal runs every stage with the ``tiny-64`` model; its notebooks start from the shipped
BPE bases (a few CPU steps of pretraining give a model whose rewards are all zero, which the
notebooks' by-hand checks refuse), so the hand-over of a built base to a notebook is exercised on
the GPU only.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import importlib.util
import json
import math
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # the package travels as the working tree: not installed there
    sys.path.insert(0, str(ROOT))

NOTEBOOKS = {"nb11": "11_grpo_vs_trl", "nb30": "30_multiturn_agent"}
STAGES = ("setup", "pretrain", "base", "rl", "nb11", "nb30")
IMPORTED = ("torch", "transformers", "accelerate", "trl", "datasets")
"""imported by this process (a broken install shows here); the rest are only looked up"""
NEEDS = {"setup": ("torch",), "pretrain": ("torch", "transformers"),
         "base": ("torch", "transformers"),
         "rl": ("torch", "transformers", "accelerate", "trl", "datasets"),
         "nb11": ("papermill", "nbclient", "ipykernel", "trl", "datasets", "yaml", "matplotlib"),
         "nb30": ("papermill", "nbclient", "ipykernel", "trl", "datasets", "yaml", "matplotlib")}
"""the modules each stage imports (setup checks them all and names what is missing)"""
AFTER = {"base": "pretrain", "rl": "base", "nb11": "base", "nb30": "pretrain"}
"""the stage whose checkpoint a stage starts from (on the GPU)"""
PRESETS = {
    "cuda": dict(
        size="medium-512", batch_size=None, docs_per_corpus=2000, probe_docs=200,
        probe_steps=10, max_pretrain_steps=4000, max_base_steps=None,
        rl=dict(num_prompts=16, group_size=8, steps=8, eval_size=64, train_size=1000),
        # 6 minutes in all: with a machine's start (1-2 minutes), two tries fit 15 minutes
        profile_steps=3, total_s=360,
        budget_s=dict(setup=40, pretrain=90, base=35, rl=50, nb11=75, nb30=70),
        # the gpu profiles' settings, but for these; "{base}" / "{pretrain}": the built folders
        notebooks=dict(
            nb11=dict(model_name="{base}", num_iters=20, eval_every=10, eval_size=200,
                      num_train_problems=2000, num_noise_runs=0, sampled_k=2,
                      powered=["final_agree"]),
            nb30=dict(sft_init="{pretrain}", sft_steps=600, num_iters=10, eval_size=64,
                      eval_every=5, trl_steps=1, trl_tool_sft_steps=60))),
    "cpu": dict(
        size="tiny-64", batch_size=8, docs_per_corpus=8, probe_docs=8, probe_steps=4,
        max_pretrain_steps=8, max_base_steps=8,
        rl=dict(num_prompts=2, group_size=4, steps=2, eval_size=8, train_size=64),
        profile_steps=2, total_s=1800,  # budgets that a loaded CPU keeps (the GPU's bind)
        budget_s=dict(setup=300, pretrain=300, base=300, rl=600, nb11=600, nb30=600),
        notebooks=dict(
            nb11=dict(device="cpu", model_name="agentrl-sft/chain-mix-bpe", num_iters=2,
                      eval_every=1, eval_size=16, num_train_problems=100, num_prompts=4,
                      group_size=4, num_noise_runs=0, sampled_k=1, powered=["final_agree"]),
            nb30=dict(device="cpu", sft_size="tiny-64", sft_init="", sft_lr=0.001, num_iters=2,
                      num_prompts=4, group_size=8, eval_size=16, eval_samples=1, eval_every=2,
                      trl_steps=1, trl_tool_sft_steps=0))),
}
RL_LOOP, RL_GEN = "gpu_check/rl_loop", "gpu_check/generation"
"""the ``record_function`` labels around the profiled loop and each generation"""
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
"""chrome-trace categories of work on the GPU (torch.profiler / kineto)"""
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
              "cudaMemcpy", "cudaMemcpyAsync")
"""CUDA runtime calls in which the host can wait for the GPU"""
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")
"""CUDA runtime and driver calls that launch a kernel"""


SLACK = 1.5
"""how much longer a built step takes than the probe's (1.33 measured on the H200)"""
MIN_STAGE_S = 10
"""a stage with less time left than this is skipped"""


class StageTimeout(Exception):
    """A stage ran past its budget (raised by the SIGALRM handler)."""


# --- small helpers --------------------------------------------------------------------------------
LOG: list[Path] = []
"""the log file of this run (set by ``main``)"""


def log(*args):
    print(*args, flush=True)
    for path in LOG:
        with open(path, "a") as f:
            print(*args, file=f)


def sync(device: str):
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def spans_union(spans):
    """Sorted, merged (start, end) intervals.

    >>> spans_union([(3, 5), (0, 1), (4, 8)])
    [(0, 1), (3, 8)]
    """
    out = []
    for s, e in sorted(spans):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def spans_length(spans) -> float:
    return sum(e - s for s, e in spans)


def spans_intersect(a, b):
    """The intersection of two lists of merged intervals.

    >>> spans_intersect([(0, 4), (6, 9)], [(3, 7)])
    [(3, 4), (6, 7)]
    """
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if s < e:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def trace_breakdown(trace: dict, loop: str = RL_LOOP, gen: str = RL_GEN) -> dict:
    """Where the wall time of the profiled loop went, from a ``torch.profiler`` chrome trace
    (``export_chrome_trace``; times in microseconds). The window is the CPU span of the ``loop``
    annotation; GPU busy time is the union of the device's kernel, copy and set spans in it, so
    overlapping kernels count once; generation is the union of the ``gen`` annotations, the update
    the rest of the window. ``device_events`` 0 means no GPU work was traced (a CPU run): the busy
    fractions are then None, not 0. Seconds throughout."""
    ev = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]

    def spans(pred):
        return spans_union((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in ev
                           if pred(e))

    def cat(e):
        return str(e.get("cat", "")).lower()

    loops = spans(lambda e: e.get("name") == loop and cat(e) == "user_annotation")
    if not loops:
        raise ValueError(f"no {loop!r} annotation in the trace")
    window = [(loops[0][0], loops[-1][1])]
    gens = spans_intersect(spans(lambda e: e.get("name") == gen and cat(e) == "user_annotation"),
                           window)
    device = spans_intersect(spans(lambda e: cat(e) in DEVICE_CATS), window)
    n_device = sum(cat(e) in DEVICE_CATS for e in ev)
    wall, gen_s = spans_length(window), spans_length(gens)
    upd_s = wall - gen_s
    busy, busy_gen = spans_length(device), spans_length(spans_intersect(device, gens))
    copies = [e for e in ev if cat(e) == "gpu_memcpy" and
              spans_intersect([(float(e["ts"]), float(e["ts"]) + float(e["dur"]))], window)]
    waits = spans_intersect(spans(lambda e: cat(e) == "cuda_runtime"
                                  and e.get("name") in SYNC_CALLS), window)
    launches = spans_intersect(spans(lambda e: cat(e) in ("cuda_runtime", "cuda_driver")
                                     and e.get("name") in LAUNCH_CALLS), window)
    kernels = sum(cat(e) == "kernel" and window[0][0] <= float(e["ts"]) < window[0][1]
                  for e in ev)
    frac = (lambda x, d: x / d if d > 0 else None) if n_device else (lambda x, d: None)
    us = 1e-6
    if not n_device:  # a CPU run: nothing on a device to count
        copies, waits, launches, kernels = None, None, None, None
    return {
        "wall_s": wall * us, "generation_s": gen_s * us, "update_s": upd_s * us,
        "gpu_busy_s": busy * us if n_device else None,
        "gpu_busy_frac": frac(busy, wall), "gpu_busy_frac_generation": frac(busy_gen, gen_s),
        "gpu_busy_frac_update": frac(busy - busy_gen, upd_s),
        "gpu_idle_s": (wall - busy) * us if n_device else None,
        "device_time_sum_s": sum(float(e["dur"]) for e in ev if cat(e) in DEVICE_CATS) * us
        if n_device else None,
        "copies": None if copies is None else len(copies),
        "copies_htod": None if copies is None else
        sum("htod" in str(e.get("name", "")).lower() for e in copies),
        "copies_dtoh": None if copies is None else
        sum("dtoh" in str(e.get("name", "")).lower() for e in copies),
        "copies_gpu_s": None if copies is None else sum(float(e["dur"]) for e in copies) * us,
        "host_wait_s": None if waits is None else spans_length(waits) * us,
        "host_launch_s": None if launches is None else spans_length(launches) * us,
        "kernels": kernels,
        "device_events": n_device,
    }


class NvmlSampler:
    """Samples the GPU's utilisation (%) and the device memory used (MiB, every process) every
    ``every`` seconds in a thread, through ``pynvml`` (nvidia-ml-py); ``available`` False when
    there is no NVML (a CPU run, or the package missing). ``summary(t0, t1)``: mean and max
    utilisation and max memory over that stretch."""

    def __init__(self, every: float = 0.2):
        self.rows, self.every, self._stop = [], every, threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nv, self._h = pynvml, pynvml.nvmlDeviceGetHandleByIndex(0)
            self.driver = pynvml.nvmlSystemGetDriverVersion()
            self.available = True
        except Exception as e:  # noqa: BLE001 - no NVML: nothing sampled, said so
            self.available, self.driver, self.reason = False, None, f"{type(e).__name__}: {e}"
        if self.available:
            threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        while not self._stop.is_set():
            try:
                u = self._nv.nvmlDeviceGetUtilizationRates(self._h).gpu
                m = self._nv.nvmlDeviceGetMemoryInfo(self._h).used / 2**20
                self.rows.append((time.perf_counter(), u, m))
            except Exception:  # noqa: BLE001 - a failed read is a missing sample
                pass
            self._stop.wait(self.every)

    def summary(self, t0: float, t1: float) -> dict:
        rows = [r for r in self.rows if t0 <= r[0] <= t1]
        if not rows:
            return {}
        return {"nvml_util_mean": sum(r[1] for r in rows) / len(rows),
                "nvml_util_max": max(r[1] for r in rows),
                "nvml_mem_used_max_mib": max(r[2] for r in rows), "nvml_samples": len(rows)}

    def stop(self):
        self._stop.set()


# --- the stages -----------------------------------------------------------------------------------
class Check:
    """One run of the check: the preset, the budgets, the results, the files written."""

    def __init__(self, args):
        self.args, self.device = args, args.device
        self.p = PRESETS["cuda" if args.device.startswith("cuda") else "cpu"]
        self.t_start = time.perf_counter()
        self.total_s = args.total_s or self.p["total_s"]
        self.out = Path(args.out)
        self.work = Path(tempfile.mkdtemp(prefix="agentrl-gpu-check-"))
        os.environ["AGENTRL_CACHE"] = str(self.work / "cache")  # a cache of this run's own
        os.environ.setdefault("AGENTRL_QUIET", "1")  # no progress bars in the log
        os.environ.setdefault("MPLBACKEND", "Agg")
        self.results = {"argv": sys.argv[1:], "device": args.device, "budget_total_s": self.total_s,
                        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                        "stages": {}, "missing": []}
        self.paths, self.curves, self.modules = {}, [], {}
        self.nvml, self.no_gpu = None, False

    def left(self) -> float:
        return self.total_s - (time.perf_counter() - self.t_start)

    # the stage runner: budget, deadline, status, files after each stage
    def run_stage(self, name: str, fn):
        rec = self.results["stages"].setdefault(name, {})
        budget = min(self.p["budget_s"][name], self.left() - 5)
        missing = [m for m in NEEDS[name] if m not in self.modules] if name != "setup" else []
        if missing:
            rec.update(status="skipped", why=f"missing {', '.join(missing)}")
        elif name != "setup" and self.no_gpu:
            rec.update(status="skipped", why="no CUDA GPU")
        elif self.needs_built(name) and AFTER[name] not in self.paths:
            rec.update(status="skipped", why=f"no {AFTER[name]} checkpoint (that stage did not "
                                             f"finish)")
        elif budget < MIN_STAGE_S:
            rec.update(status="skipped", why=f"{self.left():.0f} s left of the total budget")
        if rec.get("status") == "skipped":
            log(f"[{name}] skipped: {rec['why']}")
            self.write()
            return
        log(f"[{name}] budget {budget:.1f} s ({self.left():.0f} s left in all)")
        rec["budget_s"] = round(budget, 1)
        t0, c0 = time.perf_counter(), cpu_seconds()
        if self.device.startswith("cuda") and "torch" in self.modules:
            import torch

            torch.cuda.reset_peak_memory_stats()
        deadline = t0 + budget
        old = signal.signal(signal.SIGALRM, self._alarm)
        signal.setitimer(signal.ITIMER_REAL, budget)
        try:
            rec.update(fn(deadline) or {})
            rec["status"] = "ok"
        except StageTimeout:
            rec.update(status="timeout", why=f"ran past its {budget:.1f} s budget")
        except Exception as e:  # noqa: BLE001 - a failed stage is reported, the rest still run
            rec.update(status="failed", why=f"{type(e).__name__}: {str(e)[:500]}")
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        t1 = time.perf_counter()
        rec["wall_s"], rec["cpu_s"] = round(t1 - t0, 2), round(cpu_seconds() - c0, 2)
        if self.device.startswith("cuda") and "torch" in self.modules:
            import torch

            rec["cuda_peak_allocated_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        if self.nvml is not None:
            rec.update(self.nvml.summary(t0, t1))
        log(f"[{name}] {rec['status']} in {rec['wall_s']:.1f} s" +
            (f": {rec['why']}" if rec.get("why") else ""))
        self.write()

    def needs_built(self, name: str) -> bool:
        """Whether the stage starts from a checkpoint built here (on the CPU the notebooks start
        from the shipped bases)."""
        if name in ("setup", "pretrain"):
            return False
        if name in ("base", "rl"):
            return True
        return any("{" in str(v) for v in self.p["notebooks"][name].values())

    @staticmethod
    def _alarm(signum, frame):
        raise StageTimeout()

    def setup(self, deadline):
        rec = {"python": platform.python_version(), "machine": platform.machine()}
        if self.device.startswith("cuda") and not self.args.no_install:
            rec["install"] = self.install_wheels()
        for mod in sorted({m for ms in NEEDS.values() for m in ms}):
            try:
                if mod in IMPORTED:
                    self.modules[mod] = getattr(importlib.import_module(mod), "__version__", "?")
                elif importlib.util.find_spec(mod) is not None:
                    self.modules[mod] = version_of(mod)
                else:
                    raise ModuleNotFoundError(f"no module named {mod!r}")
            except Exception as e:  # noqa: BLE001 - reported in the MISSING line
                self.results["missing"].append(f"{mod} ({type(e).__name__}: {str(e)[:80]})")
        rec["versions"] = dict(self.modules)
        if "transformers" in self.modules:
            import transformers

            transformers.utils.logging.disable_progress_bar()  # no "Loading weights" bars
        if "torch" in self.modules:
            import torch

            rec["cuda_runtime"] = torch.version.cuda
            if not self.device.startswith("cuda"):
                torch.set_num_threads(1)  # tiny models: as fast idle, faster on a busy machine
            if self.device.startswith("cuda"):
                if not torch.cuda.is_available():
                    self.results["missing"].insert(0, f"a CUDA GPU (torch {torch.__version__} "
                                                      f"sees none)")
                    self.no_gpu = True  # every later stage is skipped, saying why
                else:
                    props = torch.cuda.get_device_properties(0)
                    rec.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                               multiprocessors=props.multi_processor_count)
                    self.nvml = NvmlSampler()
                    rec["driver"] = self.nvml.driver
                    if not self.nvml.available:
                        rec["nvml"] = f"not sampled ({self.nvml.reason})"
        if self.results["missing"]:
            line = "MISSING: " + "; ".join(self.results["missing"]) + \
                   " (carry .gpu-wheels from `make gpu-wheels`)"
            self.results["missing_line"] = line
            log(line)
        return rec

    def install_wheels(self) -> dict:
        wheels = sorted(Path(self.args.wheels).glob("*.whl"))
        if not wheels:
            return {"wheels": 0, "note": f"no wheels in {self.args.wheels}"}
        site = self.work / "site"
        t = time.perf_counter()
        res = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index",
                              "--no-deps", "--no-compile", "--no-cache-dir", "--target", str(site),
                              *map(str, wheels)], capture_output=True, text=True)
        self.append_log("pip install", res.stdout + res.stderr)
        if res.returncode != 0:
            raise RuntimeError(f"pip install of the carried wheels failed: {res.stderr[-300:]}")
        sys.path.insert(0, str(site))
        importlib.invalidate_caches()
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [str(site), str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
        return {"wheels": len(wheels), "site": str(site),
                "install_s": round(time.perf_counter() - t, 1)}

    def seconds_per_step(self, cfg, examples, weight_decay: float) -> float:
        """The mean wall time of one ``sft.fit`` step of ``cfg`` (its model, batch and lr) on
        ``examples``, after two warm-up steps: a probe on a throwaway copy of the start model."""
        from agentrl_lib.algorithms import sft

        model, tok = sft.start_model(cfg)
        rng, stamps = random.Random(cfg.seed), []

        def next_batch(step):
            sync(cfg.device)
            stamps.append(time.perf_counter())
            return rng.sample(examples, min(cfg.batch_size, len(examples)))

        k = self.p["probe_steps"]
        sft.fit(model, next_batch, lambda b: sft.masked_nll(model, b, tok.pad_token_id), k, cfg.lr,
                weight_decay=weight_decay, log_every=k)
        sync(cfg.device)
        stamps.append(time.perf_counter())
        gaps = [b - a for a, b in zip(stamps, stamps[1:])][2:]
        del model
        return sum(gaps) / len(gaps)

    def steps_for(self, s_per_step: float, deadline: float, cap: int, reserve: float) -> int:
        """As many steps as fit before ``deadline`` less ``reserve`` seconds, within [10, cap]."""
        fit_steps = int((deadline - time.perf_counter() - reserve) / s_per_step)
        return max(min(cap, fit_steps), min(10, cap))

    def build(self, label: str, cfg, examples, weight_decay: float, cap: int, deadline: float,
              reserve: float, recipe) -> dict:
        """Probe, pick the steps, build ``cfg`` at them through ``sft.checkpoint``; the loss curve
        from the checkpoint's record."""
        from agentrl_lib.algorithms import sft

        s_step = self.seconds_per_step(cfg, examples, weight_decay)
        # x SLACK: the first GPU run's pretraining built at 1.33 x the probe's time a step (the
        # model's set-up, saving, the loop's logging), and its second ran past the budget
        steps = self.steps_for(s_step * SLACK, deadline, cap, reserve)
        log(f"  {label}: {s_step * 1e3:.1f} ms a step (probe) -> {steps} steps "
            f"(recipe: {cfg.steps})")
        built = replace(cfg, steps=steps)
        t = time.perf_counter()
        path = sft.checkpoint(built, verbose=True)
        meta = json.loads((path / "agentrl_sft.json").read_text())
        self.curves += [(label, s, loss) for s, loss in meta["history"]]
        losses = [loss for _, loss in meta["history"]]
        return {"path": str(path), "probe_s_per_step": s_step, "steps": steps,
                "recipe_steps": cfg.steps, "build_s": round(time.perf_counter() - t, 2),
                "train_s": meta.get("train_s"), "size": cfg.size, "loss_first": losses[0],
                "loss_last": losses[-1],
                "loss_finite": all(math.isfinite(x) for x in losses),
                "batch_size": cfg.batch_size, "recipe_batch_size": recipe.batch_size,
                # the recipe's training time at this speed, when the batch is the recipe's
                "recipe_train_s_extrapolated": round(recipe.steps * s_step, 1)
                if cfg.batch_size == recipe.batch_size and cfg.size == recipe.size else None}

    def pretrain(self, deadline):
        import torch

        from agentrl_lib.algorithms import sft
        from agentrl_lib.models.tiny_lm import load_tokenizer

        recipe = sft.BASE_MODELS["pretrain-medium"]
        cfg = replace(recipe, size=self.p["size"], device=self.device,
                      docs_per_corpus=self.p["docs_per_corpus"],
                      batch_size=self.p["batch_size"] or recipe.batch_size)
        tok = load_tokenizer(cfg.tokenizer)
        t = time.perf_counter()
        probe_docs = sft.pretrain_documents(replace(cfg, docs_per_corpus=self.p["probe_docs"]), tok)
        probe_docs_s = time.perf_counter() - t
        examples = [(ids, [1] * len(ids)) for ids in probe_docs]
        tf32 = torch.backends.cuda.matmul.allow_tf32
        if self.device.startswith("cuda"):
            torch.backends.cuda.matmul.allow_tf32 = True  # as train_pretrain, for the probe
        # the build regenerates the full corpus: its expected time is reserved from the budget
        per_doc = probe_docs_s / max(len(probe_docs), 1)
        reserve = 10 + per_doc * cfg.docs_per_corpus * len(cfg.corpora) * 1.5
        try:
            rec = self.build("pretrain", cfg, examples, 0.1, self.p["max_pretrain_steps"],
                             deadline, reserve, recipe)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = tf32  # train_pretrain leaves it on
        self.paths["pretrain"] = rec["path"]
        mean_len = sum(len(d) for d in probe_docs) / len(probe_docs)
        rec.update(docs_per_corpus=cfg.docs_per_corpus, corpora=list(cfg.corpora),
                   batch_size=cfg.batch_size, mean_doc_tokens=round(mean_len, 1),
                   probe_docs=len(probe_docs), probe_docs_s=round(probe_docs_s, 2),
                   tokens_per_s=round(cfg.batch_size * mean_len / rec["probe_s_per_step"]),
                   recipe_docs_per_corpus=recipe.docs_per_corpus)
        return rec

    def base(self, deadline):
        from agentrl_lib.algorithms import sft
        from agentrl_lib.models.tiny_lm import load_tokenizer

        recipe = sft.BASE_MODELS["chain-mix-medium"]
        cfg = replace(recipe, size=self.p["size"], device=self.device, init=self.paths["pretrain"],
                      batch_size=self.p["batch_size"] or recipe.batch_size)
        examples = sft.task_examples(cfg, load_tokenizer(cfg.tokenizer))
        cap = self.p["max_base_steps"] or recipe.steps
        rec = self.build("base", cfg, examples, 0.01, cap, deadline, 5, recipe)
        self.paths["base"] = rec["path"]
        return rec

    def rl(self, deadline):
        """Our loop and TRL's, timed as the benchmark times them, then profiled."""
        import torch

        bench = load_benchmark()
        p = self.p["rl"]
        argv = ["--base", self.paths["base"], "--device", self.device, "--steps", str(p["steps"]),
                "--eval-every", str(p["steps"]), "--eval-size", str(p["eval_size"]),
                "--train-size", str(p["train_size"]), "--num-prompts", str(p["num_prompts"]),
                "--group-size", str(p["group_size"]), "--profile-steps", "0"]
        args = bench.parse_args(argv)
        from agentrl_lib.algorithms import grpo
        from agentrl_lib.rewards import correctness_reward

        rec = self.results["stages"]["rl"]  # filled as it goes: written after each trainer
        rec.update(batch=f"{p['num_prompts']} prompts x {p['group_size']}, at most "
                         f"{args.max_new_tokens} new tokens", steps=p["steps"])
        for impl, run in (("ours", bench.run_ours), ("trl", bench.run_trl)):
            model, tok, train, panel, _, cfg = bench.build(args)
            def evaluate(m):  # noqa: E306 - the benchmark's held-out evaluation
                return grpo.evaluate(m, tok, panel, correctness_reward, cfg.max_new_tokens)
            if self.device.startswith("cuda"):
                torch.cuda.reset_peak_memory_stats()
            t0 = time.perf_counter()
            out = run(args, model, tok, train, panel, cfg, correctness_reward, evaluate)
            rec[impl] = {"updates_per_s": cfg.num_iters / out["train_s"],
                         "gen_tokens_per_s": out["gen_tokens"] / out["train_s"],
                         "train_s": out["train_s"], "gen_tokens": out["gen_tokens"],
                         "timers": out["timers"]}
            if self.device.startswith("cuda"):
                rec[impl]["cuda_peak_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
            if self.nvml is not None:
                rec[impl].update(self.nvml.summary(t0, time.perf_counter()))
            log(f"  {impl}: {rec[impl]['updates_per_s']:.2f} updates/s, "
                f"{rec[impl]['gen_tokens_per_s']:.0f} generated tokens/s")
            del model
            free_memory()
            try:  # a profile that fails leaves the timings above and the other trainer standing
                rec[impl]["profile"] = self.profile(impl, args, bench)
            except StageTimeout:
                raise
            except Exception as e:  # noqa: BLE001 - reported in the results
                rec[impl]["profile_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            free_memory()
            self.write()

    def profile(self, impl: str, args, bench) -> dict:
        """``profile_steps`` updates of ``impl`` under torch.profiler; ``trace_breakdown``."""
        from torch.profiler import ProfilerActivity, profile, record_function

        from agentrl_lib.algorithms import grpo, trl_adapter
        from agentrl_lib.rewards import correctness_reward

        model, tok, train, _, _, cfg = bench.build(args)
        cfg = replace(cfg, num_iters=self.p["profile_steps"], eval_every=10**9)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA]
                                         if self.device.startswith("cuda") else [])
        if impl == "ours":
            import copy

            ref = copy.deepcopy(model).eval() if cfg.beta else None
            sample = grpo.completion_sampler(tok, train, [correctness_reward], cfg)

            def labelled(m, it):
                with record_function(RL_GEN):
                    return sample(m, it)

            def go():
                grpo.train(model, labelled, cfg, ref_model=ref)
        else:
            trainer = trl_adapter.make_trainer(model, tok, train, [correctness_reward], cfg,
                                               tempfile.mkdtemp(dir=self.work),
                                               device=self.device)

            def go():
                trainer.train()
        with profile(activities=acts) as prof:
            with record_function(RL_LOOP):
                go()
                sync(self.device)
        path = self.work / f"trace_{impl}.json"
        prof.export_chrome_trace(str(path))
        out = trace_breakdown(json.loads(path.read_text()))
        out["steps"] = cfg.num_iters
        out["s_per_step_profiled"] = out["wall_s"] / cfg.num_iters
        out["kernels_per_step"] = (None if out["kernels"] is None
                                   else out["kernels"] / cfg.num_iters)
        if impl == "trl":  # TRL's generation is not labelled here: only the whole loop counts
            for k in ("generation_s", "update_s", "gpu_busy_frac_generation",
                      "gpu_busy_frac_update"):
                out[k] = None
        return out

    def notebook(self, name: str, deadline) -> dict:
        nb = NOTEBOOKS[name]
        runs = self.work / "runs"
        params = {k: (v.format(**self.paths) if isinstance(v, str) else v)
                  for k, v in self.p["notebooks"][name].items()}
        budget = deadline - time.perf_counter()
        cmd = [sys.executable, "-m", "agentrl_lib.cli", "run", nb, "--profile", "gpu", "--seed",
               str(self.args.seed), "--runs", str(runs), "--cell-timeout", str(int(budget))]
        for k, v in params.items():
            text = json.dumps(v) if isinstance(v, list) else (str(v).lower()
                                                               if isinstance(v, bool) else str(v))
            cmd += ["-p", k, text]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
        signal.setitimer(signal.ITIMER_REAL, 0)  # the child's own timeout governs here
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=max(budget - 2, 1))
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the kernel too: it is in the session
            output, _ = proc.communicate()
            timed_out = True
        self.append_log(f"agentrl run {nb}", output)
        run_dir = runs / "gpu" / nb / f"seed{self.args.seed}"
        rec = self.results["stages"][name]  # kept when the stage ran past its budget
        rec.update(params=params, returncode=proc.returncode)
        run = run_dir / "run.json"
        if run.is_file():
            info = json.loads(run.read_text())
            rec.update(ok=info["ok"], error=info["error"], notebook_wall_s=info["wall_s"])
        res = run_dir / "results.json"
        rec["results_json"] = res.is_file()
        if res.is_file():
            shutil.copy(res, self.out / f"{name}_results.json")
            data = json.loads(res.read_text())
            rec["claims"] = {c["id"]: c.get("holds") for c in data.get("claims", [])}
        if timed_out:
            raise StageTimeout()
        if proc.returncode != 0 or not rec.get("ok", False):  # a failed notebook fails its stage
            raise RuntimeError(f"agentrl run {nb} failed: {rec.get('error') or first_line(output)}")

    # --- output ---------------------------------------------------------------------------------
    def append_log(self, title: str, text: str):
        """The whole output of a child process into the log file; its last lines on stdout."""
        with open(self.out / "gpu_check.log", "a") as f:
            f.write(f"\n===== {title} =====\n{text}\n===== end of {title} =====\n")
        tail = text.strip().splitlines()[-8:]
        if tail:
            print(f"  ({title}, last lines)\n" + "\n".join("    " + x for x in tail), flush=True)

    def write(self):
        self.results["elapsed_s"] = round(time.perf_counter() - self.t_start, 1)
        (self.out / "gpu_check.json").write_text(json.dumps(self.results, indent=1, default=str))
        with open(self.out / "loss_curves.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["model", "step", "loss"])
            w.writerows(self.curves)
        (self.out / "gpu_check.md").write_text(render(self.results))


def version_of(module: str) -> str:
    """The installed version of the distribution that provides ``module`` ('?' if unknown)."""
    import importlib.metadata as md

    for dist in md.packages_distributions().get(module, [module]):
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            continue
    return "?"


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and its finished children."""
    import resource

    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def free_memory():
    """Drop what the last trainer left, so the next one's peak is its own."""
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def load_benchmark():
    """``reproductions/benchmarks/grpo_vs_trl.py`` as a module (a script, not in the package)."""
    path = ROOT / "reproductions" / "benchmarks" / "grpo_vs_trl.py"
    spec = importlib.util.spec_from_file_location("grpo_vs_trl", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def first_line(text) -> str:
    return (str(text).splitlines() or [""])[0]


def fmt(x, nd=2, pct=False):
    if x is None:
        return "n/a"
    if pct:
        return f"{100 * x:.0f}%"
    return f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def render(r: dict) -> str:
    """The markdown summary of a run's results (every number from ``r``)."""
    st = r["stages"]
    s = st.get("setup", {})
    lines = [f"# GPU check ({r['device']}), {r['started']}", ""]
    lines.append(f"Device: {s.get('gpu', 'no GPU')} ({fmt(s.get('gpu_memory_gib'), 1)} GiB), "
                 f"driver {s.get('driver') or 'n/a'}, torch {s.get('versions', {}).get('torch')} "
                 f"(CUDA {s.get('cuda_runtime')}), transformers "
                 f"{s.get('versions', {}).get('transformers')}, trl "
                 f"{s.get('versions', {}).get('trl')}; Python {s.get('python')}.")
    if r.get("missing_line"):
        lines += ["", f"**{r['missing_line']}**"]
    lines += ["", f"## Stages (total budget {r['budget_total_s']} s, used {r.get('elapsed_s')} s)",
              "", "| stage | status | budget s | wall s | CPU s | CUDA peak MiB | "
              "NVML util mean % | "
              "device memory used max MiB | note |", "|---|---|---|---|---|---|---|---|---|"]
    for name in STAGES:
        x = st.get(name, {})
        lines.append(f"| {name} | {x.get('status', 'not run')} | {fmt(x.get('budget_s'), 0)} | "
                     f"{fmt(x.get('wall_s'), 1)} | {fmt(x.get('cpu_s'), 1)} | "
                     f"{fmt(x.get('cuda_peak_allocated_mib'), 0)} | "
                     f"{fmt(x.get('nvml_util_mean'), 0)} | {fmt(x.get('nvml_mem_used_max_mib'), 0)}"
                     f" | {x.get('why', '')} |")
    for name in ("pretrain", "base"):
        x = st.get(name, {})
        if "probe_s_per_step" in x:
            what = {"pretrain": "pretrain-medium", "base": "chain-mix-medium"}[name]
            lines += ["", f"**{name}** ({what}'s recipe at {x['size']}, batch {x['batch_size']}): "
                      f"{x['steps']} steps of the recipe's {x['recipe_steps']} "
                      f"({fmt(x['probe_s_per_step'] * 1e3, 1)} ms a step, probe), built in "
                      f"{fmt(x['build_s'], 1)} s; loss {fmt(x['loss_first'], 3)} -> "
                      f"{fmt(x['loss_last'], 3)}."]
            if x["recipe_train_s_extrapolated"] is not None:
                lines[-1] += (f" The recipe's {x['recipe_steps']} steps would train in about "
                              f"{fmt(x['recipe_train_s_extrapolated'], 0)} s here (extrapolated "
                              f"from the probe).")
            if name == "pretrain":
                lines[-1] += (f" Corpus: {x['docs_per_corpus']} documents a corpus of "
                              f"{x['corpora']} (recipe: {x['recipe_docs_per_corpus']}), "
                              f"{x['mean_doc_tokens']} tokens a document on average; about "
                              f"{x['tokens_per_s']} tokens/s in training (unpadded).")
    rl = st.get("rl", {})
    if "ours" in rl:
        lines += ["", f"## Our GRPO loop vs TRL's GRPOTrainer ({rl['batch']}, {rl['steps']} "
                  "updates, evaluations excluded)", "", "| | ours | TRL | ours / TRL |",
                  "|---|---|---|---|"]
        rows = [("updates/s", "updates_per_s", 2), ("generated tokens/s", "gen_tokens_per_s", 0),
                ("CUDA peak allocated, MiB", "cuda_peak_allocated_mib", 0),
                ("NVML utilisation, mean %", "nvml_util_mean", 0)]
        for label, key, nd in rows:
            o, t = rl["ours"].get(key), rl.get("trl", {}).get(key)
            ratio = o / t if o is not None and t else None
            lines.append(f"| {label} | {fmt(o, nd)} | {fmt(t, nd)} | {fmt(ratio, 2)} |")
        prof = [(k, rl[k]["profile"]) for k in ("ours", "trl") if "profile" in rl.get(k, {})]
        lines += [f"\nThe profile of {k} failed: {rl[k]['profile_error']}" for k in ("ours", "trl")
                  if "profile_error" in rl.get(k, {})]
        if prof:
            lines += ["", "Under torch.profiler (its overhead on the host included):", "",
                      "| | ours | TRL |", "|---|---|---|"]
            rows = [("wall s a step (profiled)", "s_per_step_profiled", None),
                    ("GPU busy, share of the loop's wall", "gpu_busy_frac", "pct"),
                    ("generation, share of the wall", "generation_s", "wall"),
                    ("GPU busy during generation", "gpu_busy_frac_generation", "pct"),
                    ("GPU busy during the update", "gpu_busy_frac_update", "pct"),
                    ("host-device copies (HtoD / DtoH)", "copies", "copies"),
                    ("GPU time in copies, s", "copies_gpu_s", None),
                    ("GPU time summed over events (overlaps twice), s", "device_time_sum_s", None),
                    ("host waiting on the GPU (syncs, copies), s", "host_wait_s", None),
                    ("host launching kernels, s", "host_launch_s", None),
                    ("kernels a step", "kernels_per_step", None)]
            d = dict(prof)
            for label, key, how in rows:
                cells = []
                for k in ("ours", "trl"):
                    x = d.get(k, {})
                    v = x.get(key)
                    if how == "pct":
                        cells.append(fmt(v, pct=True))
                    elif how == "wall":
                        cells.append(fmt(v / x["wall_s"] if v is not None and x.get("wall_s")
                                         else None, pct=True))
                    elif how == "copies":
                        cells.append(f"{fmt(x.get('copies_htod'))} / {fmt(x.get('copies_dtoh'))}")
                    else:
                        cells.append(fmt(v, 3))
                lines.append(f"| {label} | " + " | ".join(cells) + " |")
            lines.append("The rest of the wall (GPU idle) is the host running Python and "
                         "launching kernels while the GPU waits.")
    for name in ("nb11", "nb30"):
        x = st.get(name, {})
        if "params" in x:
            claims = ", ".join(f"{k} {'holds' if v else 'fails' if v is not None else 'n/a'}"
                               for k, v in x.get("claims", {}).items())
            lines += ["", f"**{NOTEBOOKS[name]}** (gpu profile, overridden: {x['params']}): "
                      f"{'ok' if x.get('ok') else 'not ok: ' + first_line(x.get('error'))}; "
                      f"results.json {'written' if x.get('results_json') else 'missing'}"
                      + (f"; claims: {claims}" if claims else "") + "."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="'cuda' (the check) or 'cpu' (the rehearsal)")
    ap.add_argument("--out", default=os.environ.get("OUT") or "gpu-out",
                    help="where the files go (default: $OUT, else ./gpu-out)")
    ap.add_argument("--wheels", default=str(ROOT / ".gpu-wheels"), help="the carried wheels")
    ap.add_argument("--no-install", action="store_true", help="use the installed packages only")
    ap.add_argument("--total-s", type=float, default=0, help="override the preset's total budget")
    ap.add_argument("--stages", default=",".join(STAGES), help="a subset, comma-separated")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "gpu_check.log").write_text("")
    LOG[:] = [Path(args.out) / "gpu_check.log"]
    check = Check(args)
    wanted = set(args.stages.split(",")) | {"setup"}
    fns = {"setup": check.setup, "pretrain": check.pretrain, "base": check.base, "rl": check.rl,
           "nb11": lambda d: check.notebook("nb11", d), "nb30": lambda d: check.notebook("nb30", d)}
    try:
        for name in STAGES:
            if name in wanted:
                check.run_stage(name, fns[name])
    finally:
        if check.nvml is not None:
            check.nvml.stop()
        check.write()
        shutil.rmtree(check.work, ignore_errors=True)
    ok = all(x.get("status") == "ok" for x in check.results["stages"].values())
    log(f"gpu check: {'every stage ok' if ok else 'not every stage ok'} in "
        f"{check.results['elapsed_s']} s; files in {args.out}")
    if check.results.get("missing_line"):
        log(check.results["missing_line"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
