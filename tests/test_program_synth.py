"""The stack language by hand, ProgramSynthTask's tasks and human programs, and judging in the
sandbox: a runaway or malformed program fails its tests with a reason."""

import pytest

from agentrl_lib.envs import stack_lang
from agentrl_lib.envs.program_synth import ProgramSynthTask
from agentrl_lib.envs.stack_lang import StackError


@pytest.mark.parametrize("prog,x,want", [
    ("dup mul 1 add", 3, 10), ("2 sub", 5, 3), ("3 swap sub", 5, -2), ("dup over mul", 4, 16),
    ("drop 7", 1, 7), ("inc inc neg", 2, -4), ("dec", 0, -1), ("3 rep inc", 10, 13),
    ("0 rep inc", 10, 10), ("dup rep dec", 4, 0), ("2 rep dup add add", 1, 3),
])
def test_stack_language_by_hand(prog, x, want):
    # "2 rep dup add add": [1] -> dup dup -> [1 1 1] -> add add -> 3
    assert stack_lang.run(prog, x) == want


@pytest.mark.parametrize("prog,msg", [("add", "underflow"), ("foo", "unknown token 'foo'"),
                                      ("drop rep inc", "underflow"), ("1 rep", "token after"),
                                      ("2 rep rep inc", "rep cannot follow rep"), ("drop", "empty")])
def test_stack_language_errors(prog, msg):
    with pytest.raises(StackError, match=msg):
        stack_lang.run(prog, 1)
    with pytest.raises(StackError, match="step limit"):
        stack_lang.run("9 9 mul rep inc", 0, max_steps=50)
    with pytest.raises(StackError, match="stack limit"):
        stack_lang.run("9 9 mul rep dup", 0, max_stack=20)


def test_tasks_are_deterministic_minimal_and_shown_from_their_tests():
    T = ProgramSynthTask()
    for seed in range(20):
        t = T.task(seed)
        assert t == T.task(seed)
        outs = [y for _, y in t["tests"]]
        assert outs == T.outputs(t["reference"]) and len(set(outs)) > 1
        assert outs != list(T.test_inputs)  # never the identity
        toks = t["reference"].split()
        assert all(T.outputs(" ".join(toks[:i] + toks[i + 1:])) != outs for i in range(len(toks)))
        assert t["prompt"] == " ".join(f"f({x})={y}" for x, y in t["tests"][:T.num_shown])


def test_human_programs_mix_rewrites_and_bugs():
    T = ProgramSynthTask()
    rates = [r for s in range(30) for _, r in T.human_programs(s)]
    for s in range(30):
        progs = T.human_programs(s)
        assert progs[0] == (T.task(s)["reference"], 1.0)
        for p, r in progs:  # every rate is the in-process judge's
            assert r == T.evaluate(p, T.task(s)["tests"], sandbox=False)["pass_rate"]
    assert 0.2 < sum(r == 1.0 for r in rates) / len(rates) < 0.8  # mixed quality


def test_sandboxed_judging_equals_in_process_and_survives_runaways():
    T = ProgramSynthTask(cpu_s=0.5)
    t = T.task(3)
    for prog, _ in T.human_programs(3):
        a, b = T.evaluate(prog, t["tests"]), T.evaluate(prog, t["tests"], sandbox=False)
        assert (a["passed"], a["reason"]) == (b["passed"], b["reason"])
    loop = T.evaluate("9 dup mul dup mul dup mul rep inc", t["tests"])  # 43M steps
    assert loop["passed"] == 0 and loop["reason"] == "cpu_time"
    bad = T.evaluate("dup foo", t["tests"])
    assert bad["passed"] == 0 and bad["reason"] == "stack_error" and "foo" in bad["error"]
    with pytest.raises(ValueError, match="num_shown"):
        ProgramSynthTask(num_shown=0)
