"""reasoning-gym's procedural task generators as agentrl text tasks: prompts, a held-out split, a
hashed panel and a difficulty level from each generator's curriculum.

reasoning-gym (Stojanovski et al. 2025, "REASONING GYM: Reasoning Environments for Reinforcement
Learning with Verifiable Rewards", arXiv:2505.24760; code ``open-thought/reasoning-gym``, pinned
0.1.25, the optional extra ``agentrl[envs]``, imported here only inside functions) has about a
hundred seeded generators, each ``create_dataset(name, size, seed, **cfg)`` giving entries
``{"question", "answer", "metadata"}`` and a verifier ``score_answer(answer, entry)`` in [0, 1].
Everything runs offline.

A problem here is what ``text_tasks.make_problems`` gives, so the same samplers, SFT and TRL
adapter take it: ``{"prompt": question, "answer": str, "task": name, "difficulty": level,
"entry": the entry as JSON}``; ``rewards.rgym.rgym_reward`` reads ``task`` and ``entry`` and calls
the generator's own ``score_answer``.

- **Split**: ``text_tasks.split_of`` on the prompt (about 20% 'test'), the project's one rule, so
  train and held-out problems never share a prompt however many are drawn.
- **Seeds**: the generator's config seed of chunk c is a hash of (name, level, cfg, split, seed,
  c); reasoning-gym draws entry i of a chunk from ``Random(seed + i)``, so a problem list is a pure
  function of the arguments.
- **Difficulty**: ``level`` is the generator's curriculum global level (``create_curriculum(name)
  .set_global_level(level)``: every attribute at that level, capped at its last; e.g. chain_sum's
  level 1 is 2-3 terms of 1-2 digits). ``level=None`` uses the generator's default config. Extra
  keyword arguments override config fields either way.
- **Panel**: ``eval_panel`` draws ``n`` test problems with seed 12345 and hashes their prompts and
  answers (``protocol.eval_panel``), as ``text_tasks.eval_panel`` does.

``TOKENIZER_TASKS`` are the generators whose prompts and answers the project's BPE tokenizer reads
without a byte it was never trained on (``coverage``): every character ASCII (the tokenizer's
corpus is ASCII, so a non-ASCII character falls to byte tokens whose embeddings never trained),
short prompts, integer answers. number_sequence reads best of all (no letters) but its generator
squares terms without a bound, so from level 2 (up to 16 terms) one entry can take minutes of
big-integer arithmetic: it is left out.
"""

from __future__ import annotations

import hashlib
import json

from agentrl_lib.envs import protocol
from agentrl_lib.envs.text_tasks import _prompts_and_answers, split_of

TOKENIZER_TASKS = ("chain_sum", "basic_arithmetic", "count_bits")
"""reasoning-gym generators the BPE tokenizer covers (ASCII, integer answers; ``coverage``)"""
PANEL_SEED = 12345
"""the seed of every held-out panel (``text_tasks.eval_panel``'s)"""
CHUNK = 64
"""entries per generator call (a config seed per chunk)"""


def _config_seed(*parts) -> int:
    return int(hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:8], 16)


def make_config(name: str, level: int | None = None, **cfg):
    """The generator's config: its curriculum at global ``level`` (None: the default config),
    then the fields of ``cfg``."""
    from reasoning_gym.factory import CURRICULA, DATASETS

    if name not in DATASETS:
        raise ValueError(f"unknown reasoning-gym task {name!r}")
    if level is None:
        return DATASETS[name][1](**cfg)
    if name not in CURRICULA:
        raise ValueError(f"reasoning-gym task {name!r} has no curriculum; pass level=None")
    curriculum = CURRICULA[name]()
    if level < 0:
        raise ValueError(f"level must be >= 0, got {level}")
    curriculum.set_global_level(level)
    import dataclasses
    return dataclasses.replace(curriculum.generate_configuration(), **cfg)


def num_levels(name: str) -> int:
    """Levels of the generator's curriculum: the most any attribute has."""
    from reasoning_gym.factory import CURRICULA

    return max(len(a.levels) for a in CURRICULA[name]().attributes.values())


def _dataset(name: str, level, cfg: dict, config_seed: int, size: int):
    import dataclasses

    from reasoning_gym.factory import DATASETS

    config = dataclasses.replace(make_config(name, level, **cfg), seed=config_seed, size=size)
    if hasattr(config, "validate"):
        config.validate()
    return DATASETS[name][0](config=config)


def make_problems(name: str, n: int, level: int | None = 0, split: str = "train", seed: int = 0,
                  strict: bool = True, **cfg) -> list[dict]:
    """``n`` distinct problems of generator ``name`` at curriculum ``level`` from ``split``
    ('train' or 'test'; module docstring). A small space may hold fewer: ``strict`` raises then,
    otherwise all there are come back."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    out: dict[str, dict] = {}  # prompt -> problem, in the order drawn
    for problem in _candidates(name, level, split, seed, cfg, chunks=200 * n // CHUNK + 20):
        if split_of(problem["prompt"]) == split:
            out.setdefault(problem["prompt"], problem)
        if len(out) == n:
            break
    if len(out) < n and strict:
        raise ValueError(f"only {len(out)} distinct {split} problems of {name} at level {level}; "
                         f"ask for fewer than {n}")
    return list(out.values())


def _candidates(name, level, split, seed, cfg, chunks):
    """The generator's entries as problems, chunk after chunk (a config seed per chunk)."""
    for chunk in range(chunks):
        ds = _dataset(name, level, cfg, _config_seed(name, level, cfg, split, seed, chunk), CHUNK)
        for i in range(CHUNK):
            entry = ds[i]
            yield {"prompt": entry["question"], "answer": str(entry["answer"]), "task": name,
                   "difficulty": level, "entry": json.dumps(entry, default=list)}


def eval_panel(name: str, n: int = 200, level: int | None = 0, **cfg) -> tuple[list[dict], str]:
    """The fixed held-out panel (seed ``PANEL_SEED`` of the test split) and its hash."""
    probs = make_problems(name, n, level, split="test", seed=PANEL_SEED, **cfg)
    return protocol.eval_panel(n, seeds=probs, blob=_prompts_and_answers)


def curriculum_problems(name: str, n: int, levels, split: str = "train", seed: int = 0,
                        **cfg) -> dict[int, list[dict]]:
    """{level: ``n`` problems}: the pools a difficulty curriculum draws from
    (``algorithms.curriculum`` schedules which level an iteration trains on)."""
    return {lv: make_problems(name, n, lv, split, seed, **cfg) for lv in levels}


CHAIN_FORM = {"basic_arithmetic": {"operators": ["+", "-"], "allow_parentheses": False,
                                    "allow_negation": False}}
"""config fields that keep a generator to left-to-right sums and differences, the form
``worked_solution`` works (chain_sum has it at every level)"""


def worked_solution(problem: dict) -> str:
    """The step-by-step completion of a left-to-right sum of integers (chain_sum; basic_arithmetic
    under ``CHAIN_FORM``), one step a line, then ``answer N``: the form of
    ``text_tasks.chain_solution``, which the chain bases were trained on. Raises ValueError on any
    other expression (a product, parentheses, a negated term).

    >>> worked_solution({"answer": "17", "entry": '{"metadata": {"expression": "8 - 4 + 7 + 6"}}'})
    '8-4=4\\n4+7=11\\n11+6=17\\nanswer 17'
    """
    expr = json.loads(problem["entry"])["metadata"]["expression"]
    terms = expr.split()
    ops, nums = terms[1::2], terms[0::2]
    if not all(t.isdigit() for t in nums) or set(ops) - {"+", "-"} or len(ops) != len(nums) - 1:
        raise ValueError(f"not a left-to-right sum of integers: {expr!r}")
    value, lines = int(nums[0]), []
    for op, b in zip(ops, nums[1:]):
        new = value + int(b) if op == "+" else value - int(b)
        lines.append(f"{value}{op}{b}={new}")
        value = new
    if str(value) != problem["answer"]:
        raise ValueError(f"{expr!r} works out to {value}, the entry says {problem['answer']}")
    return "\n".join(lines + [f"answer {value}"])


def coverage(tokenizer, texts: list[str]) -> dict:
    """How well ``tokenizer`` (a byte-level BPE) reads ``texts``: ``unknown`` pieces (the unk
    token, or text the tokenizer drops: a decode that does not give the text back), ``non_ascii``
    characters (read as byte tokens outside the project's ASCII corpus), ``chars_per_token`` and
    ``single_letter`` (the fraction of tokens that are one letter: words the corpus never had)."""
    unknown = non_ascii = chars = tokens = single = 0
    unk = tokenizer.unk_token_id
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        unknown += sum(i == unk for i in ids) if unk is not None else 0
        unknown += tokenizer.decode(ids) != text
        non_ascii += sum(ord(c) > 127 for c in text)
        chars, tokens = chars + len(text), tokens + len(ids)
        pieces = [p.replace("\u0120", "") for p in tokenizer.convert_ids_to_tokens(ids)]
        single += sum(len(p) == 1 and p.isalpha() for p in pieces)
    return {"unknown": unknown, "non_ascii": non_ascii, "chars_per_token": chars / max(tokens, 1),
            "single_letter": single / max(tokens, 1), "tokens_per_text": tokens / max(len(texts), 1)}
