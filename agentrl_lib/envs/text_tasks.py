"""Verifiable single-turn text tasks, generated in code, with a difficulty knob and a held-out split.

- ``arithmetic``: ``a+b=`` / ``a-b=`` / ``a*b=`` with operands of ``difficulty`` digits.
- ``countdown``: reach a target with + - * over given numbers, each used at most once
  (the Countdown task of TinyZero-style RLVR, simplified to small numbers).
- ``program``: programming by example in the stack language (``program_synth``): the prompt shows
  f(x) = y, the answer is a program of ``difficulty`` tokens, judged by its unit tests.
- ``chain``: a step-structured arithmetic chain ``start 3, +4, *2, -5``; ``difficulty`` is the
  number of steps, so the reasoning needed grows with it. Each step has an exact checker.

A problem is a dict ``{"prompt": str, "answer": str, "task": str, "difficulty": int, ...}``.
The split is decided by a hash of the prompt (``split_of``), so train and held-out problems never
overlap however many are drawn. ``eval_panel`` draws a fixed held-out panel and returns its hash,
so numbers from different runs are comparable only when the hashes match.
"""

from __future__ import annotations

import hashlib
import operator
import random

from agentrl_lib.envs import protocol
from agentrl_lib.rewards.verifiable import eval_expression

HELD_OUT_FRACTION = 0.2
_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def split_of(prompt: str) -> str:
    """'test' for about 20% of prompts (by a stable hash), else 'train'."""
    h = int(hashlib.sha256(prompt.encode()).hexdigest()[:8], 16)
    return "test" if (h % 1000) < HELD_OUT_FRACTION * 1000 else "train"


def _arithmetic(rng: random.Random, difficulty: int) -> dict:
    lo, hi = 10 ** (difficulty - 1) if difficulty > 1 else 0, 10**difficulty - 1
    a, b = rng.randint(lo, hi), rng.randint(lo, hi)
    op = rng.choice("+-*" if difficulty <= 2 else "+-")
    return {"prompt": f"{a}{op}{b}=", "answer": str(_OPS[op](a, b)), "task": "arithmetic",
            "difficulty": difficulty}


def _countdown(rng: random.Random, difficulty: int) -> dict:
    """``difficulty`` + 1 numbers in 1..9; the target is made by a random expression over a subset."""
    nums = [rng.randint(1, 9) for _ in range(difficulty + 1)]
    k = rng.randint(2, len(nums))
    pick = rng.sample(range(len(nums)), k)
    expr = str(nums[pick[0]])
    for i in pick[1:]:
        expr = f"({expr}{rng.choice('+-*')}{nums[i]})"
    target = eval_expression(expr)
    return {"prompt": f"use {' '.join(map(str, nums))} to make {target}:", "answer": str(target),
            "numbers": nums, "solution": expr, "task": "countdown", "difficulty": difficulty}


def _chain(rng: random.Random, difficulty: int) -> dict:
    x = rng.randint(1, 9)
    steps, values = [], [x]
    for _ in range(difficulty):
        op = rng.choice("+-*")
        v = rng.randint(2, 3) if op == "*" else rng.randint(1, 9)
        steps.append(f"{op}{v}")
        values.append(_OPS[op](values[-1], v))
    return {"prompt": f"{x} {' '.join(steps)} =", "answer": str(values[-1]), "task": "chain",
            "difficulty": difficulty, "steps": steps, "values": values}


def _program(rng: random.Random, difficulty: int) -> dict:
    """``program_synth.ProgramSynthTask``'s programming by example as a text task: the prompt shows
    f(x) = y, the answer is a minimal reference program of ``difficulty`` tokens (one of several
    right programs: judge with ``program_synth.program_reward``, which runs the tests)."""
    from agentrl_lib.envs.program_synth import ProgramSynthTask
    t = ProgramSynthTask(min_len=difficulty, max_len=difficulty).task(rng.randrange(2**31))
    return {"prompt": t["prompt"], "answer": t["reference"], "tests": t["tests"], "task": "program",
            "difficulty": difficulty, "seed": t["seed"]}


GENERATORS = {"arithmetic": _arithmetic, "countdown": _countdown, "chain": _chain,
              "program": _program}


def make_problems(task: str, n: int, difficulty: int = 1, split: str = "train",
                  seed: int = 0, strict: bool = True) -> list[dict]:
    """``n`` distinct problems of ``task`` from ``split`` ('train' or 'test'). A small space (e.g.
    one-digit arithmetic) may hold fewer: ``strict`` raises then, otherwise all there are come back."""
    if task not in GENERATORS:
        raise ValueError(f"unknown task {task!r}; choose one of {list(GENERATORS)}")
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    rng = random.Random(f"{task}-{difficulty}-{split}-{seed}")
    out, seen = [], set()
    for _ in range(200 * n + 1000):
        p = GENERATORS[task](rng, difficulty)
        if p["prompt"] in seen or split_of(p["prompt"]) != split:
            continue
        seen.add(p["prompt"])
        out.append(p)
        if len(out) == n:
            return out
    if not strict:
        return out
    raise ValueError(f"only {len(out)} distinct {split} problems of {task} at difficulty "
                     f"{difficulty}; ask for fewer than {n}")


def panel_hash(problems: list[dict]) -> str:
    return protocol.panel_hash(_prompts_and_answers(problems))


def _prompts_and_answers(problems: list[dict]) -> list[tuple]:
    return [(p["prompt"], p["answer"]) for p in problems]


def eval_panel(task: str, n: int = 200, difficulty: int = 1) -> tuple[list[dict], str]:
    """The fixed held-out evaluation panel (seed 12345 of the test split) and its hash."""
    probs = make_problems(task, n, difficulty, split="test", seed=12345)
    return protocol.eval_panel(n, seeds=probs, blob=_prompts_and_answers)


def chain_solution(problem: dict) -> str:
    """The step-by-step reference completion of a chain problem, one step a line.

    >>> chain_solution({"steps": ["+4", "*2"], "values": [3, 7, 14]})
    '3+4=7\\n7*2=14\\nanswer 14'
    """
    lines = [f"{a}{s[0]}{s[1:]}={b}" for a, s, b in zip(problem["values"], problem["steps"],
                                                       problem["values"][1:])]
    return "\n".join(lines + [f"answer {problem['values'][-1]}"])


def reference_completion(problem: dict) -> str:
    """What SFT teaches: the answer (arithmetic), an expression (countdown), or the steps (chain)."""
    if problem["task"] == "chain":
        return chain_solution(problem)
    if problem["task"] == "countdown":
        return problem["solution"]
    return problem["answer"]
