"""Bad input to the reward functions (issue 29): ``safe_eval`` bounds its work, never the clock;
depth is nesting, not length; a full-width (NFKC-equal) text never scores as the exact ASCII form;
a column whose length differs from the completions' is a one-line ValueError naming the lengths."""

import time

import pytest

from agentrl_lib.envs.calc_tool import CalcToolEnv
from agentrl_lib.envs.program_synth import program_reward
from agentrl_lib.rewards import reward_model, tool_calls, verifiable
from agentrl_lib.rewards.tool_calls import (call_match, exact_match_reward, parse_call, safe_eval,
                                            toolrl_reward)
from agentrl_lib.rewards.verifiable import (chain_step_reward, correctness_reward,
                                            countdown_reward, extract_answer,
                                            partial_credit_reward)

GOLD = 'calc(expression="3*4")'


def test_safe_eval_does_not_depend_on_the_clock(monkeypatch):
    ticks = iter(range(0, 10**6, 10))  # every reading of the clock is 10 s after the last

    monkeypatch.setattr(time, "perf_counter", lambda: float(next(ticks)))
    monkeypatch.setattr(time, "monotonic", lambda: float(next(ticks)))
    # a paused process (the 0.05 s wall-clock bound failed these): the same value as ever
    assert safe_eval("(3+4)*2-1") == 13 and safe_eval("2**10 - 24") == 1000
    assert toolrl_reward([GOLD], gold_call=[GOLD]) == [4.0]


def _nested(levels: int) -> str:
    return "1" + "+(1" * levels + ")" * levels  # 1+(1+(1+...)): levels of parentheses


def test_safe_eval_depth_is_nesting_not_length():
    assert safe_eval("+".join(["1"] * 33)) == 33  # "nested deeper than 32" before
    assert safe_eval("-".join(["2"] * 40)) == 2 - 2 * 39
    assert safe_eval("*".join(["2"] * 40)) == 2**40
    assert safe_eval("2*3+4*5-6/3+7%4") == 6 + 20 - 2 + 3  # mixed precedence, left to right
    assert safe_eval("100/10/5") == 2 and safe_eval("2**3**2") == 512  # associativity kept
    # the expression tree: Expression (1) > the outer chain (2) > each ( ) one level more; the
    # innermost literal sits at depth levels + 1, so 31 levels fit max_depth = 32 and 32 do not
    assert safe_eval(_nested(31), max_chars=1000) == 32
    with pytest.raises(ValueError, match="nested deeper than 32"):
        safe_eval(_nested(32), max_chars=1000)
    assert safe_eval(_nested(5), max_depth=6) == 6
    with pytest.raises(ValueError, match="nested deeper than 5"):
        safe_eval(_nested(5), max_depth=5)


def test_safe_eval_bounds_the_work():
    # operations: the 200-character default never reaches 256 nodes; a raised max_chars does
    assert safe_eval("+".join(["1"] * 100)) == 100  # 199 characters, 200 nodes
    assert safe_eval("+".join(["1"] * 128), max_chars=1000) == 128  # 256 nodes: at the bound
    with pytest.raises(ValueError, match="more than 256 operations"):
        safe_eval("+".join(["1"] * 129), max_chars=1000)
    assert safe_eval("+".join(["1"] * 129), max_chars=1000, max_ops=300) == 129
    with pytest.raises(ValueError, match="more than 10 operations"):
        safe_eval("1+2+3+4+5+6", max_ops=10)  # 1 + 6 constants + 5 additions = 12 nodes
    # number size, exponent size
    assert safe_eval("10**15") == 10**15
    with pytest.raises(ValueError, match="exceeds"):
        safe_eval("10**15+1")
    with pytest.raises(ValueError, match="exponent 65 too large"):
        safe_eval("1**65")
    # nesting past Python's own parser and recursion limits: the depth error, never RecursionError
    with pytest.raises(ValueError, match="nested deeper than"):
        safe_eval("-" * 5000 + "1", max_chars=10**4)
    with pytest.raises(ValueError, match="nested deeper than|operations"):
        safe_eval("(" * 3000 + "1" + ")" * 3000, max_chars=10**4, max_depth=10**4)


FULL_WIDTH = ['ｃａｌｃ(expression="3*4")', 'calc(ｅｘｐｒｅｓｓｉｏｎ="3*4")',
              'ｃａｌｃ(ｅｘｐｒｅｓｓｉｏｎ="3*4")', 'calc(expression="３*４")',
              'calc(expression="\u30003*4")']


def test_full_width_is_never_the_exact_call():
    assert exact_match_reward([GOLD], gold_call=[GOLD]) == [4.0]
    for text in FULL_WIDTH[:3]:  # Python's parser reads these as calc(expression=...) (NFKC)
        with pytest.raises(ValueError, match="not 'c|not 'e"):
            parse_call(text)
    assert exact_match_reward(FULL_WIDTH, gold_call=[GOLD] * 5) == [-3.0] * 3 + [-2.0] * 2
    assert [call_match(t, GOLD)["exact"] for t in FULL_WIDTH] == [False] * 5
    # the values are read as written: parses (format 1), the name and key right, the value not
    assert toolrl_reward(FULL_WIDTH[3:], gold_call=[GOLD] * 2) == [1 + 6 * 2 / 3 - 3] * 2
    # ASCII spaces around a value are still the same value (documented)
    assert exact_match_reward(['calc( expression = " 3*4 " )'], gold_call=[GOLD]) == [4.0]
    env = CalcToolEnv(invalid_penalty=-0.5)
    env.reset(seed=0)
    obs, r, _, info = env.step('ｃａｌｃ(expression="3*4")')
    assert not info["valid"] and r == -0.5 and obs.startswith("Error: malformed tool call")


def test_verifiable_rewards_read_ascii_digits_only_and_any_length():
    assert correctness_reward(["46", "0046", "answer 46"], answer=["46"] * 3) == [1.0] * 3
    assert correctness_reward(["４６", "answer ４６", "٤٦"], answer=["46"] * 3) == [0.0] * 3
    assert extract_answer("-0") == "0" and extract_answer("-007") == "-7"
    huge = "9" * 5000  # int() refuses more than 4300 digits: ValueError escaped before
    assert correctness_reward([huge, "answer " + huge], answer=["1", huge]) == [0.0, 1.0]
    assert partial_credit_reward([huge], answer=["99"]) == [2 / 5000]
    assert format_ok([huge, "４"]) == [1.0, 0.0]
    got = countdown_reward(["(3+4)*2", huge + "*1", "-" * 5000 + "3", "３+４"],
                           numbers=[[3, 4, 2]] * 4, answer=["14", "14", "-3", "7"])
    assert got == [1.0, 0.0, 0.0, 0.0]


def format_ok(completions):
    return verifiable.format_reward(completions)


LENGTH_CASES = [
    (correctness_reward, dict(answer=["1"])),
    (partial_credit_reward, dict(answer=["1"])),
    (countdown_reward, dict(numbers=[[1], [1]], answer=["1"])),
    (chain_step_reward, dict(steps=[["+1"]] * 3, values=[[1, 2]])),
    (toolrl_reward, dict(gold_call=[GOLD])),
    (exact_match_reward, dict(gold_call=[GOLD] * 3)),
    (program_reward, dict(tests=[[]])),
]


@pytest.mark.parametrize("fn,columns", LENGTH_CASES, ids=lambda x: getattr(x, "__name__", ""))
def test_a_column_of_another_length_is_a_one_line_error(fn, columns):
    completions = ["1", "2"]
    with pytest.raises(ValueError) as err:
        fn(completions, **columns)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"{fn.__name__}: completions has 2 entries but ")
    for name, col in columns.items():
        if len(col) != 2:
            assert f"{name} has {len(col)}" in msg
        else:
            assert name not in msg


def test_reward_model_texts_check_lengths():
    with pytest.raises(ValueError, match="chat_texts: completions has 2 entries but prompts has 1"):
        reward_model.chat_texts(None, ["p"], ["a", "b"])
    with pytest.raises(ValueError, match="chosen_texts has 1 entries but rejected_texts has 2"):
        reward_model.lm_pair_rewards(None, None, ["a"], ["b", "c"])
    assert tool_calls.check_columns is verifiable.check_columns  # one implementation
