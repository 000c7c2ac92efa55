"""Benchmark: the cost of the sandbox's OS isolation (bubblewrap namespaces) per run, against its
weaker hook mode (the same supervisor, limits, seccomp filter and audit hook, no namespaces).

    .venv/bin/python reproductions/benchmarks/sandbox_isolation.py --runs 50

Times, in one run, ``--runs`` calls of each mode on two programs, the modes interleaved (bwrap,
hook, bwrap, ...) so that a change of machine load hits both alike:
- a trivial program (``result = 1``): the fixed cost of a run;
- the stack-language judge of ``program_synth`` (its interpreter and 8 unit tests), the program the
  project runs most in the sandbox (notebook 71).
Printed: the median wall time per run of each mode (ms) and the ratio bwrap / hook (above 1: the
isolation costs that factor). bwrap's first call (finding the interpreter's libraries with ldd,
probing that bwrap works) is made before the timing and reported apart.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from agentrl_lib.envs import sandbox  # noqa: E402
from agentrl_lib.envs.program_synth import ProgramSynthTask, _INTERPRETER  # noqa: E402


def time_modes(code: str, inputs: dict, runs: int) -> dict:
    times = {"bwrap": [], "hook": []}
    for _ in range(runs):
        for mode in times:
            t = time.perf_counter()
            res = sandbox.run_python(code, inputs, isolation=mode)
            times[mode].append(time.perf_counter() - t)
            assert res.ok, (mode, res)
    return {m: 1e3 * statistics.median(v) for m, v in times.items()}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=50)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    problem = sandbox.bwrap_problem()
    first_ms = 1e3 * (time.perf_counter() - t0)
    if problem is not None:
        print(f"no benchmark: {problem}")
        return {}
    task = ProgramSynthTask()
    t = task.task(0)
    judge = _INTERPRETER + ("\nresult = [run(inputs['program'], x) for x in inputs['xs']]\n")
    out = {"first_call_ms": first_ms,
           "trivial": time_modes("result = 1", {}, args.runs),
           "stack_judge": time_modes(judge, {"program": t["reference"],
                                             "xs": [x for x, _ in t["tests"]]}, args.runs)}
    print(f"bwrap's first call (ldd of the interpreter's libraries, a probe run): "
          f"{first_ms:.0f} ms")
    for name in ("trivial", "stack_judge"):
        m = out[name]
        m["ratio"] = m["bwrap"] / m["hook"]
        print(f"{name} ({args.runs} runs each, median per run): bwrap {m['bwrap']:.1f} ms, "
              f"hook {m['hook']:.1f} ms; bwrap / hook = {m['ratio']:.2f}x")
    return out


if __name__ == "__main__":
    main()
