"""CalcToolEnv's calculator does not depend on the wall clock (the machine's load)."""
import itertools

import pytest

from agentrl_lib.envs import calc_tool
from agentrl_lib.rewards import tool_calls


def test_calc_tool_ignores_a_slow_clock(monkeypatch):
    # a clock that jumps one second at every reading: a descheduled process, seen from safe_eval
    ticks = itertools.count()
    monkeypatch.setattr(tool_calls.time, "perf_counter", lambda: float(next(ticks)))
    with pytest.raises(ValueError, match="took longer"):
        tool_calls.safe_eval("7*4")  # the evaluator's own default keeps its deadline
    assert calc_tool.run_tool("calc", {"expression": "7*4"}) == ("28", None)
    env = calc_tool.CalcToolEnv(templates=("order",))
    env.reset(seed=0)
    for call in env.task.gold:  # lookup, then calc, then answer: the gold episode still succeeds
        obs, reward, done, info = env.step(call)
        assert info["valid"], obs
    assert done and info["success"] and reward == 1.0
    # the other bounds still hold
    assert calc_tool.run_tool("calc", {"expression": "9**9**9"})[1].startswith("calc: bad")
