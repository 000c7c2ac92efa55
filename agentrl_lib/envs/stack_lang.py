"""A tiny stack language for program synthesis (``program_synth.ProgramSynthTask``).

A program is a string of space-separated tokens run on a stack of integers that starts as [x];
its output is the top of the stack at the end. Tokens:

- ``0`` .. ``9``: push the digit;
- ``dup`` (a -> a a), ``swap`` (a b -> b a), ``drop`` (a ->), ``over`` (a b -> a b a);
- ``add``, ``sub``, ``mul`` (a b -> a+b, a-b, a*b); ``inc``, ``dec``, ``neg`` (a -> a+1, a-1, -a);
- ``rep``: pop n and run the next token n times (n <= 0: skip it). ``rep`` makes runaway
  programs possible ("9 dup mul dup mul dup mul rep inc": 43 million steps; "... rep dup": a
  stack of millions), which is what the sandbox is for.

This module imports nothing: its source is sent as is to the sandbox (``sandbox.run_python``), so
the interpreter that runs a model's program lives in the sandboxed process, not in the caller.
``run`` takes optional step and stack limits for trusted in-process use (the human programs).
"""

TOKENS = ("0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "dup", "swap", "drop", "over", "add",
          "sub", "mul", "inc", "dec", "neg", "rep")


class StackError(Exception):
    """A program that cannot run: an unknown token, too few values on the stack, a limit passed."""


def parse(text):
    """The token list of a program text; StackError naming the first unknown token."""
    tokens = text.split()
    for i, t in enumerate(tokens):
        if t not in TOKENS:
            raise StackError(f"unknown token {t!r} at position {i}")
    return tokens


def run(text, x, max_steps=None, max_stack=None):
    """The output of program ``text`` on input ``x`` (the top of the stack at the end).

    >>> run("dup mul 1 add", 3)
    10
    >>> run("3 rep inc", 0)
    3
    """
    tokens = parse(text)
    stack = [int(x)]
    steps = [0]

    def pop():
        if not stack:
            raise StackError("stack underflow")
        return stack.pop()

    def do(t):
        steps[0] += 1
        if max_steps is not None and steps[0] > max_steps:
            raise StackError(f"step limit {max_steps} passed")
        if t.isdigit():
            stack.append(int(t))
        elif t == "dup":
            a = pop()
            stack.extend((a, a))
        elif t == "swap":
            b, a = pop(), pop()
            stack.extend((b, a))
        elif t == "drop":
            pop()
        elif t == "over":
            b, a = pop(), pop()
            stack.extend((a, b, a))
        elif t in ("add", "sub", "mul"):
            b, a = pop(), pop()
            stack.append(a + b if t == "add" else a - b if t == "sub" else a * b)
        elif t in ("inc", "dec", "neg"):
            a = pop()
            stack.append(a + 1 if t == "inc" else a - 1 if t == "dec" else -a)
        else:  # only "rep" reaches here: "rep rep" is not a loop of loops
            raise StackError("rep cannot follow rep")
        if max_stack is not None and len(stack) > max_stack:
            raise StackError(f"stack limit {max_stack} passed")

    i = 0
    while i < len(tokens):
        t = tokens[i]
        if t == "rep":
            n = pop()
            if i + 1 >= len(tokens):
                raise StackError("rep needs a token after it")
            for _ in range(n):
                do(tokens[i + 1])
            i += 2
            continue
        do(t)
        i += 1
    if not stack:
        raise StackError("empty stack at the end")
    return stack[-1]
