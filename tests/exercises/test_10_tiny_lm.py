"""10_tiny_lm: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np
import pytest

from agentrl_lib.exercises import ExerciseError, check


def test_nb10_logps_and_chat_example(notebook, answerable):
    from agentrl_lib.models.tiny_lm import char_tokenizer
    from agentrl_lib.rollout import chat_example, logps_from_logits

    def right_logps(logits, ids, temperature, scale=True):
        z = np.asarray(logits, dtype=np.float64) / (temperature if scale else 1.0)  # (B, T, V)
        z = z - z.max(-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        picked = np.take_along_axis(logp, np.asarray(ids)[..., None], -1)[..., 0]
        return picked, -(np.exp(logp) * logp).sum(-1)

    tok = char_tokenizer()

    def right_chat(prompt, completion, eos_in_mask=True):
        head = f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
        ids = tok(head + completion + tok.eos_token, add_special_tokens=False)["input_ids"]
        n = len(completion) + 1  # one token per character, then the end-of-turn token
        return ids, [0] * (len(ids) - n) + [1] * (n - 1) + [1 if eos_in_mask else 0]

    # the reference works in float32: the notebook checks with atol=1e-5, and so does this
    assert check(right_logps, logps_from_logits, notebook("logits_inputs"), atol=1e-5)
    with pytest.raises(ExerciseError):  # ignores the temperature
        check(lambda *x: right_logps(*x, scale=False), logps_from_logits, notebook("logits_inputs"),
              atol=1e-5)
    answerable(right_chat, lambda p, c: right_chat(p, c, eos_in_mask=False),
               lambda p, c: chat_example(tok, p, c), notebook("chat_inputs"))
