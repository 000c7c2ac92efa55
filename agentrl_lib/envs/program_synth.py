"""ProgramSynthTask: write a stack-language program (``stack_lang``) from input-output examples;
the program is judged by unit tests run in the sandbox (``sandbox.run_python``), so a model's
runaway program (an endless ``rep``, a stack of millions) fails its tests with a reason and never
hangs or crashes the training run. The shared environment of issue 15's program-synthesis papers
(B-Coder's value-based RL on off-policy programs, Step-Q's step-level Q annotations).

**A task** (``task(seed)``): a target function whose shortest straight-line program (no ``rep``)
has ``min_len`` .. ``max_len`` tokens (``minimal_programs`` enumerates them: 3 such functions of one
token, 27 of two, 66 of three, 442 of four), shown as ``num_shown`` examples "f(x) = y" and judged
on unit tests at every x of ``test_inputs`` (the shown examples included).

**Human programs** (``human_programs``): the off-policy data B-Coder learns from. Per task, the
reference, equivalent rewrites of it (``2 mul`` <-> ``dup add``, ``1 add`` <-> ``inc``, ...) and
buggy variants (one token replaced, inserted or deleted), each with its pass rate on the tests: a
data set of mixed quality, like programs scraped from people.

**Judging** (``evaluate``): ``sandbox=True`` runs the interpreter and the program in a sandboxed
process (cpu_s, memory_mb; bubblewrap, or the weaker hook mode where it is missing: the
interpreter is ours and the program is data to it), all tests in one process; ``sandbox=False``
runs them here with the interpreter's step and stack limits (for trusted programs, ~1000x faster). Either way the result
is (passed tests, total, reason) with reason 'ok', a stack error, or the sandbox's reason.
"""

from __future__ import annotations

import functools
import inspect
import itertools

import numpy as np

from agentrl_lib.envs import sandbox, stack_lang
from agentrl_lib.envs.stack_lang import StackError
from agentrl_lib.rewards.verifiable import check_columns

_STRAIGHT = [t for t in stack_lang.TOKENS if t != "rep"]
_REWRITES = [("2 mul", "dup add"), ("1 add", "inc"), ("1 sub", "dec"), ("0 swap sub", "neg"),
             ("swap add", "add"), ("swap mul", "mul")]
_INTERPRETER = inspect.getsource(stack_lang)


class ProgramSynthTask:
    """Programming by example in the stack language, judged by sandboxed unit tests."""

    def __init__(self, min_len: int = 2, max_len: int = 4, num_shown: int = 4,
                 test_inputs=(0, 1, 2, 3, -1, -2, 5, -3), cpu_s: float = 1.0, memory_mb: int = 128,
                 max_steps: int = 10_000, max_stack: int = 1000):
        if not 1 <= min_len <= max_len <= 5:
            raise ValueError(f"need 1 <= min_len <= max_len <= 5 (programs are enumerated), got "
                             f"{min_len}, {max_len}")
        if not 1 <= num_shown <= len(test_inputs):
            raise ValueError(f"num_shown must be in 1..{len(test_inputs)}, got {num_shown}")
        self.min_len, self.max_len, self.num_shown = int(min_len), int(max_len), int(num_shown)
        self.test_inputs = tuple(int(x) for x in test_inputs)
        self.cpu_s, self.memory_mb = cpu_s, memory_mb
        self.max_steps, self.max_stack = max_steps, max_stack

    def outputs(self, program: str):
        """The program's outputs on the test inputs, in process; None if it fails on any."""
        try:
            return [stack_lang.run(program, x, self.max_steps, self.max_stack) for x in self.test_inputs]
        except StackError:
            return None

    def reference(self, seed: int) -> str:
        """The task's target function as its shortest program (``minimal_programs``): a length
        drawn uniformly in ``min_len`` .. ``max_len``, then a function uniformly among those whose
        shortest program has that length (never a constant, never the identity)."""
        table = minimal_programs(self.max_len, self.test_inputs)
        lengths = [n for n in range(self.min_len, self.max_len + 1) if table.get(n)]
        if not lengths:
            raise ValueError(f"no non-constant function has a shortest program of "
                             f"{self.min_len}..{self.max_len} tokens")
        rng = np.random.default_rng([int(seed), 11])
        progs = table[lengths[int(rng.integers(len(lengths)))]]
        return progs[int(rng.integers(len(progs)))]

    def task(self, seed: int) -> dict:
        """prompt (the shown examples), tests [(x, y)], the reference program."""
        ref = self.reference(seed)
        tests = [(x, stack_lang.run(ref, x)) for x in self.test_inputs]
        shown = tests[:self.num_shown]
        prompt = " ".join(f"f({x})={y}" for x, y in shown)
        return {"seed": int(seed), "prompt": prompt, "tests": tests, "reference": ref}

    def evaluate(self, program: str, tests, sandbox: bool = True) -> dict:
        """passed, total, pass_rate and reason of ``program`` on ``tests`` (module docstring)."""
        tests = [(int(x), int(y)) for x, y in tests]
        if sandbox:
            code = _INTERPRETER + (
                "\nouts = []\nfor x in inputs['xs']:\n"
                "    try:\n        outs.append(run(inputs['program'], x))\n"
                "    except StackError as err:\n        outs.append(str(err))\n"
                "result = outs\n")
            res = _sandbox_run(code, {"program": str(program), "xs": [x for x, _ in tests]},
                               self.cpu_s, self.memory_mb)
            if not res.ok:
                return {"passed": 0, "total": len(tests), "pass_rate": 0.0, "reason": res.reason,
                        "error": res.error}
            outs = res.value
        else:
            outs = []
            for x, _ in tests:
                try:
                    outs.append(stack_lang.run(program, x, self.max_steps, self.max_stack))
                except StackError as err:
                    outs.append(str(err))
        passed = sum(isinstance(o, int) and o == y for o, (_, y) in zip(outs, tests))
        errors = [o for o in outs if isinstance(o, str)]
        return {"passed": passed, "total": len(tests), "pass_rate": passed / max(len(tests), 1),
                "reason": "ok" if not errors else "stack_error",
                "error": errors[0] if errors else None}

    def human_programs(self, seed: int, num_buggy: int = 4) -> list[tuple[str, float]]:
        """[(program, pass rate)]: the reference, its equivalent rewrites, ``num_buggy`` one-token
        mutants (replace, insert or delete), judged in process (module docstring)."""
        t = self.task(seed)
        ref = t["reference"]
        progs = [ref]
        for a, b in _REWRITES:
            for old, new in ((a, b), (b, a)):
                if f" {old} " in f" {ref} ":
                    progs.append(f" {ref} ".replace(f" {old} ", f" {new} ", 1).strip())
        rng = np.random.default_rng([int(seed), 12])
        toks = ref.split()
        for _ in range(num_buggy):
            kind, i = int(rng.integers(3)), int(rng.integers(len(toks)))
            new = list(toks)
            tok = _STRAIGHT[int(rng.integers(len(_STRAIGHT)))]
            if kind == 0:
                new[i] = tok
            elif kind == 1:
                new.insert(i, tok)
            elif len(new) > 1:
                del new[i]
            progs.append(" ".join(new))
        out, seen = [], set()
        for p in progs:
            if p not in seen:
                seen.add(p)
                out.append((p, self.evaluate(p, t["tests"], sandbox=False)["pass_rate"]))
        return out


@functools.lru_cache(maxsize=8)
def minimal_programs(max_len: int, test_inputs: tuple) -> dict[int, list[str]]:
    """{n: programs}: every function of x that a straight-line program (no ``rep``) of at most
    ``max_len`` tokens computes on ``test_inputs``, keyed by the length of its shortest program and
    represented by the first shortest one in token order; constants and the identity left out.
    Enumerated once per process: 20**n programs of each length n (about 2 s up to 4 tokens, 40 s
    with 5)."""
    seen, table = set(), {}
    for n in range(1, max_len + 1):
        for toks in itertools.product(_STRAIGHT, repeat=n):
            try:
                outs = tuple(stack_lang.run(" ".join(toks), x, 100, 100) for x in test_inputs)
            except StackError:
                continue
            if outs in seen:
                continue
            seen.add(outs)
            if len(set(outs)) > 1 and outs != tuple(test_inputs):
                table.setdefault(n, []).append(" ".join(toks))
    return table


def program_reward(completions, tests, sandbox: bool = True, **kwargs) -> list[float]:
    """1.0 when the completion (a program) passes every unit test of its task, else 0.0: the binary
    test reward of B-Coder, in TRL's reward signature (``tests`` is the data set's column of
    ``task(seed)["tests"]``). A model writes these programs, so they run in the sandbox by default."""
    check_columns("program_reward", completions=completions, tests=tests)
    judge = ProgramSynthTask()
    out = []
    for c, t in zip(completions, tests):
        text = c[-1]["content"] if isinstance(c, list) else str(c)
        out.append(float(judge.evaluate(text.strip(), t, sandbox=sandbox)["pass_rate"] == 1.0))
    return out


def _sandbox_run(code, inputs, cpu_s, memory_mb):
    # the code is this project's interpreter; the model's program is data to it, so it may run
    # in the sandbox's weaker mode where bubblewrap is missing (sandbox's module docstring)
    return sandbox.run_python(code, inputs, cpu_s=cpu_s, memory_mb=memory_mb,
                              isolation="bwrap_or_hook")
