"""CalcToolEnv's calculator does not depend on the wall clock (the machine's load)."""
import itertools
import time

from agentrl_lib.envs import calc_tool
from agentrl_lib.rewards import tool_calls


def test_calc_tool_ignores_a_slow_clock(monkeypatch):
    # a clock that jumps one second at every reading: a descheduled process, seen from safe_eval
    ticks = itertools.count()
    for name in ("perf_counter", "monotonic", "time"):
        monkeypatch.setattr(time, name, lambda: float(next(ticks)))
    assert tool_calls.safe_eval("7*4") == 28  # the evaluator bounds its work, not the clock
    assert calc_tool.run_tool("calc", {"expression": "7*4"}) == ("28", None)
    env = calc_tool.CalcToolEnv(templates=("order",))
    env.reset(seed=0)
    for call in env.task.gold:  # lookup, then calc, then answer: the gold episode still succeeds
        obs, reward, done, info = env.step(call)
        assert info["valid"], obs
    assert done and info["success"] and reward == 1.0
    # the other bounds still hold
    assert calc_tool.run_tool("calc", {"expression": "9**9**9"})[1].startswith("calc: bad")
