"""Verifiable rewards in TRL's reward-function signature.

``reward(completions, **kwargs) -> list[float]``: ``completions`` is a list of strings, or of
conversations (lists of ``{"role", "content"}`` dicts, TRL's conversational format, whose last
message is scored); every other column of the data set (``answer``, ``numbers``, ...) arrives as a
keyword list aligned with ``completions``. The same functions therefore plug into our loops and
into ``trl.GRPOTrainer(reward_funcs=[...])`` unchanged. A column whose length differs from
``completions`` is a ValueError naming the lengths (``check_columns``), never a silently shorter
list of rewards.

**What is read as an answer** is exactly what the docstrings say, in ASCII: digits are ``0-9``
(Python's ``int`` would also read full-width or Arabic-Indic digits, so a different string would
score as the exact answer), and the integer is compared as text, so no completion is too long to
read (``int`` refuses more than 4300 digits).
"""

from __future__ import annotations

import ast
import operator
import re

_ANSWER = re.compile(r"answer\s*(-?[0-9]+)\s*$")
_INT = re.compile(r"^\s*(-?[0-9]+)\s*$")


def check_columns(fn_name: str, **columns) -> None:
    """ValueError unless every column has as many entries as the first (``zip`` would silently
    drop the rest); the message names the function and the lengths.

    >>> check_columns("correctness_reward", completions=["1", "2"], answer=["1"])
    Traceback (most recent call last):
    ...
    ValueError: correctness_reward: completions has 2 entries but answer has 1
    """
    (first, ref), *rest = columns.items()
    bad = [f"{k} has {len(v)}" for k, v in rest if len(v) != len(ref)]
    if bad:
        raise ValueError(f"{fn_name}: {first} has {len(ref)} entries but {', '.join(bad)}")


def eval_expression(expr: str) -> int:
    """Evaluate + - * over integers and parentheses, nothing else.

    >>> eval_expression("(3+4)*2-1")
    13
    >>> eval_expression("__import__('os')")
    Traceback (most recent call last):
    ...
    ValueError: not an arithmetic expression: "__import__('os')"
    """
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ValueError(f"not an arithmetic expression: {expr[:40]!r}") from None
    bin_ops = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in bin_ops:
            return bin_ops[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise ValueError(f"not an arithmetic expression: {expr[:40]!r}")

    try:
        return ev(tree)
    except RecursionError:  # a chain of thousands of terms
        raise ValueError(f"not an arithmetic expression: {expr[:40]!r} (nested too deep)") from None


def _text(c) -> str:
    if isinstance(c, str):
        return c
    if isinstance(c, list) and c and isinstance(c[-1], dict):
        return c[-1].get("content", "")
    raise TypeError(f"a completion must be a string or a list of messages, got {type(c).__name__}")


def extract_answer(text: str) -> str | None:
    """The final integer: the whole text if it is one integer, else the number after a last
    ``answer``. Anything else is unparseable (None).

    >>> extract_answer("42"), extract_answer("3+4=7\\nanswer 7"), extract_answer("about 7")
    ('42', '7', None)
    """
    for pattern in (_INT, _ANSWER):
        m = pattern.search(text.strip())
        if m:  # int's normal form as text: no leading zeros, no "-0"
            digits = m.group(1).lstrip("-").lstrip("0") or "0"
            return digits if digits == "0" or not m.group(1).startswith("-") else "-" + digits
    return None


def correctness_reward(completions, answer, **kwargs) -> list[float]:
    """1.0 when the extracted answer equals the reference, else 0.0.

    >>> correctness_reward(["46", " 46 ", "answer 46", "45", "46 apples"], answer=["46"] * 5)
    [1.0, 1.0, 1.0, 0.0, 0.0]
    >>> correctness_reward([[{"role": "assistant", "content": "7"}]], answer=["7"])
    [1.0]
    """
    check_columns("correctness_reward", completions=completions, answer=answer)
    return [float(extract_answer(_text(c)) == str(a)) for c, a in zip(completions, answer)]


def format_reward(completions, **kwargs) -> list[float]:
    """1.0 when an answer can be extracted at all (the output is well formed), else 0.0.

    >>> format_reward(["12", "3+4=7\\nanswer 7", "seven"])
    [1.0, 1.0, 0.0]
    """
    return [float(extract_answer(_text(c)) is not None) for c in completions]


def partial_credit_reward(completions, answer, **kwargs) -> list[float]:
    """Fraction of the reference's digits right, aligned from the right (units first); a wrong
    length or sign costs through the alignment. 1.0 only for the exact answer.

    >>> partial_credit_reward(["123", "124", "23", "x"], answer=["123"] * 4)
    [1.0, 0.6666666666666666, 0.6666666666666666, 0.0]
    """
    check_columns("partial_credit_reward", completions=completions, answer=answer)
    out = []
    for c, a in zip(completions, answer):
        got, ref = extract_answer(_text(c)), str(a)
        if got is None:
            out.append(0.0)
            continue
        n = max(len(got), len(ref))
        right = sum(x == y for x, y in zip(got.rjust(n)[::-1], ref.rjust(n)[::-1]))
        out.append(right / n)
    return out


def countdown_reward(completions, numbers, answer, **kwargs) -> list[float]:
    """1.0 when the completion is an expression over the given numbers (each used at most once)
    that evaluates to the target, else 0.0.

    >>> countdown_reward(["(3+4)*2", "3*4-2", "7*2", "(3+4)*2"], numbers=[[3, 4, 2]] * 3 + [[3, 4]],
    ...                  answer=["14"] * 4)
    [1.0, 0.0, 0.0, 0.0]
    """
    check_columns("countdown_reward", completions=completions, numbers=numbers, answer=answer)
    out = []
    for c, nums, a in zip(completions, numbers, answer):
        text = _text(c).strip()
        found = re.findall(r"[0-9]+", text)
        used = [int(x) for x in found if len(x) <= 18]  # a longer literal is in no pool
        pool = list(nums)
        ok = len(used) == len(found)
        for u in used:
            if u in pool:
                pool.remove(u)
            else:
                ok = False
        try:
            ok = ok and bool(used) and eval_expression(text) == int(a)
        except ValueError:
            ok = False
        out.append(float(ok))
    return out


def chain_step_reward(completions, steps, values, **kwargs) -> list[float]:
    """Partial credit for a chain: the fraction of steps written correctly as ``a<op>v=b`` lines,
    in order, from the start value; 1.0 needs every step and the final answer line.

    >>> chain_step_reward(["3+4=7\\n7*2=14\\nanswer 14", "3+4=7\\n7*2=15\\nanswer 15"],
    ...                   steps=[["+4", "*2"]] * 2, values=[[3, 7, 14]] * 2)
    [1.0, 0.3333333333333333]
    """
    check_columns("chain_step_reward", completions=completions, steps=steps, values=values)
    out = []
    for c, st, vals in zip(completions, steps, values):
        lines = _text(c).strip().split("\n")
        good = 0
        for i, (s, a, b) in enumerate(zip(st, vals, vals[1:])):
            if i < len(lines) and lines[i].replace(" ", "") == f"{a}{s}={b}":
                good += 1
            else:
                break
        final = float(extract_answer(_text(c)) == str(vals[-1]))
        out.append((good + final) / (len(st) + 1))
    return out
