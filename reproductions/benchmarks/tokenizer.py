"""Tokens per observation, per action and per worked solution: the character tokenizer against the
BPE one (``algorithms.subword``), and each environment's longest expert conversation against the
context (issue 26, sections 1 and 2).

Measured on conversations the tokenizer never saw: task seeds from 7e6 (the corpus uses 5e6 + i)
and the held-out split of the text tasks. "bound" is the most a tokenizer that splits digits one per
token could save: characters / (digits + the runs of non-digits between them), i.e. every maximal
non-digit run one token. Usage:

    python reproductions/benchmarks/tokenizer.py [--episodes 100] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import re
import time

import numpy as np

from agentrl_lib.algorithms import subword
from agentrl_lib.algorithms.sft import scripted_policy
from agentrl_lib.envs.text_tasks import GENERATORS, make_problems, reference_completion
from agentrl_lib.models.tiny_lm import CONTEXT, load_tokenizer
from agentrl_lib.rollout import play_episodes, text_episodes_to_tokens

HELD_OUT = 7_000_000


def bound(texts: list[str]) -> float:
    """characters / (digits + maximal non-digit runs): the best ratio with digits split."""
    chars = sum(map(len, texts))
    pieces = sum(len(re.findall(r"\d|\D+", t)) for t in texts)
    return chars / max(pieces, 1)


def ratio_row(name: str, what: str, texts: list[str], char, bpe) -> dict:
    n = lambda tok: sum(len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts)  # noqa
    c, b = n(char), n(bpe)
    return dict(name=name, what=what, n=len(texts), char=c / len(texts), bpe=b / len(texts),
                ratio=c / b, bound=bound(texts))


def longest(make_env, tok, episodes: int, epsilon: float) -> tuple[int, int]:
    """(longest conversation in tokens, its turns) over ``episodes`` scripted plays."""
    env = make_env()
    eps = play_episodes(make_env, scripted_policy(epsilon, np.random.default_rng(1)),
                        [HELD_OUT + i for i in range(episodes)], 1, env.max_turns)
    text_episodes_to_tokens(tok, eps, getattr(env, "system_prompt", ""))
    lengths = [len(ep.prompt_ids) + len(ep.token_ids) for ep in eps]
    k = int(np.argmax(lengths))
    return lengths[k], len(eps[k])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--episodes", type=int, default=100)
    ap.add_argument("--problems", type=int, default=200)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    t0 = time.time()
    char, bpe = load_tokenizer("char"), load_tokenizer("bpe")
    rows = []
    for name, make_env in subword.CORPUS_ENVS.items():
        env = make_env()
        eps = play_episodes(make_env, scripted_policy(0.3, np.random.default_rng(0)),
                            [HELD_OUT + i for i in range(args.episodes)], 1, env.max_turns)
        rows.append(ratio_row(name, "observation", [o for ep in eps for o in ep.observations],
                              char, bpe))
        rows.append(ratio_row(name, "action", [a for ep in eps for a in ep.actions], char, bpe))
    for task in GENERATORS:
        probs = [p for d in (1, 2, 3, 4)
                 for p in make_problems(task, args.problems, d, "test", strict=False)]
        rows.append(ratio_row(task, "prompt", [p["prompt"] for p in probs], char, bpe))
        rows.append(ratio_row(task, "worked solution", [reference_completion(p) for p in probs],
                              char, bpe))
    lines = ["## Tokens per text (held-out conversations and problems)", "",
             "| corpus | text | n | char tokens | BPE tokens | char / BPE | bound with digits split |"
             " >= 3x |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['what']} | {r['n']} | {r['char']:.1f} | {r['bpe']:.1f} | "
                     f"{r['ratio']:.2f} | {r['bound']:.2f} | {'yes' if r['ratio'] >= 3 else 'no'} |")
    met = sum(r["ratio"] >= 3 for r in rows)
    lines += ["", f"{met} of {len(rows)} rows reach 3x; of those that do not, "
              f"{sum(r['ratio'] < 3 and r['bound'] < 3 for r in rows)} cannot with digits split "
              f"(bound < 3).", ""]
    lines += ["## Longest expert conversation against the context", "",
              f"Scripted policy on {args.episodes} held-out task seeds; epsilon 0 (the expert) and "
              "0.3 (the SFT demonstrations' noise). Whole conversation: first prompt (system "
              "message included) + every turn.", "",
              "| environment | expert turns | char tokens | BPE tokens | noisy (0.3) char | noisy BPE |"
              f" fits {CONTEXT['char']} (char) | fits {CONTEXT['bpe']} (BPE) |",
              "|---|---|---|---|---|---|---|---|"]
    for name, make_env in subword.CORPUS_ENVS.items():
        (c0, turns), (b0, _) = (longest(make_env, char, args.episodes, 0.0),
                                longest(make_env, bpe, args.episodes, 0.0))
        (c3, _), (b3, _) = (longest(make_env, char, args.episodes, 0.3),
                            longest(make_env, bpe, args.episodes, 0.3))
        lines.append(f"| {name} | {turns} | {c0} | {b0} | {c3} | {b3} | "
                     f"{'yes' if max(c0, c3) <= CONTEXT['char'] else 'no'} | "
                     f"{'yes' if max(b0, b3) <= CONTEXT['bpe'] else 'no'} |")
    lines += ["", f"({time.time() - t0:.0f} s)"]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
