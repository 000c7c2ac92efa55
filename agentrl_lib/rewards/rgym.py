"""reasoning-gym's verifiers as reward functions in TRL's signature.

``rgym_reward(completions, task, entry, **kwargs) -> list[float]``: for each completion, the
answer text (``answer_text``) scored by the generator's own ``score_answer(answer, entry)``
(reasoning-gym 0.1.25, ``reasoning_gym/dataset.py``, ``ProceduralDataset.score_answer`` and each
generator's override), so a reward is exactly what reasoning-gym's evaluation would give that
answer. ``task`` and ``entry`` are the columns ``envs.rgym.make_problems`` writes (the entry as
JSON), which TRL hands over as keyword lists; the same function plugs into ``grpo.train`` and
``trl.GRPOTrainer(reward_funcs=[rgym_reward])``. reasoning-gym is imported only when scoring.
"""

from __future__ import annotations

import json
import re

from agentrl_lib.rewards.verifiable import _text

_TAG = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)
_ANSWER_LINE = re.compile(r"(?:^|\n)\s*answer\s+(.*?)\s*$", re.DOTALL)
_SCORERS: dict = {}


def answer_text(text: str) -> str:
    """The answer a completion gives: the last ``<answer>...</answer>`` (reasoning-gym's format,
    ``reasoning_gym.utils.extract_answer``), else what follows a last line-initial ``answer``
    (the project's ``answer N`` form), else the whole text; stripped. reasoning-gym's default
    ``score_answer`` gives partial credit to an answer that merely contains the right one, so the
    answer is cut out before scoring.

    >>> answer_text("<answer> 42 </answer>"), answer_text("3+4=7\\nanswer 7"), answer_text(" -4 ")
    ('42', '7', '-4')
    """
    tags = _TAG.findall(text)
    if tags:
        return tags[-1].strip()
    m = _ANSWER_LINE.search(text)
    return (m.group(1) if m else text).strip()


def score_fn(task: str):
    """The ``score_answer`` of reasoning-gym generator ``task`` (cached)."""
    if task not in _SCORERS:
        from reasoning_gym import get_score_answer_fn

        _SCORERS[task] = get_score_answer_fn(task)
    return _SCORERS[task]


def rgym_reward(completions, task, entry, **kwargs) -> list[float]:
    """reasoning-gym's ``score_answer`` of each completion's ``answer_text`` (module docstring);
    ``entry`` is a JSON string (``envs.rgym``) or the entry dict."""
    out = []
    for c, name, e in zip(completions, task, entry):
        e = json.loads(e) if isinstance(e, str) else e
        out.append(float(score_fn(name)(answer_text(_text(c)), e)))
    return out
