"""The tiny LM substrate: tokenizer, save/load through from_pretrained, generation with the KV cache."""

import pytest
import torch

from agentrl_lib.models.loading import load_policy
from agentrl_lib.models.tiny_lm import build_tokenizer
from agentrl_lib.rollout import completion_mask_from_ids, generate, sequence_logps


def chat(tok, content):
    return tok.apply_chat_template([{"role": "user", "content": content}],
                                   add_generation_prompt=True, tokenize=False)


def test_tokenizer_roundtrip_and_template():
    tok = build_tokenizer()
    text = "Q: 12*(3+4)=?\nA: 84"
    assert tok.decode(tok(text)["input_ids"]) == text
    assert len(tok(text)["input_ids"]) == len(text)  # one token per character
    s = chat(tok, "1+1=")
    assert s == "<|im_start|>user\n1+1=<|im_end|>\n<|im_start|>assistant\n"
    assert tok.convert_ids_to_tokens(tok(s)["input_ids"])[0] == "<|im_start|>"


def test_save_and_load_from_pretrained(tiny_lm, tmp_path):
    model, tok = tiny_lm
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    model2, tok2 = load_policy(str(tmp_path))
    x = torch.tensor([tok(chat(tok, "7+8="))["input_ids"]])
    assert torch.allclose(model(x).logits, model2.eval()(x).logits, atol=1e-6)
    assert tok2.decode(x[0]) == tok.decode(x[0])
    # encoding too, with config.json beside the tokenizer (AutoTokenizer would rebuild a qwen2
    # byte-level tokenizer from it and drop the newlines)
    text = chat(tok, "12 + 34 =\nok")
    assert tok2(text)["input_ids"] == tok(text)["input_ids"]
    assert tok2.apply_chat_template([{"role": "user", "content": "a"}], tokenize=False) == \
        tok.apply_chat_template([{"role": "user", "content": "a"}], tokenize=False)


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint at"):
        load_policy(str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="unknown tiny model size 'huge'"):
        load_policy("agentrl/huge")


def test_completion_mask():
    ids = torch.tensor([[3, 4, 9, 9], [9, 1, 9, 2], [1, 2, 3, 4]])
    assert completion_mask_from_ids(ids, 9).tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1]]


def test_generation_logps_match_forward_pass(tiny_lm):
    model, tok = tiny_lm
    prompts = [chat(tok, c) for c in ["12+7=", "3+4=", "100+23=", "9="]] * 2  # left padding differs
    out = generate(model, tok, prompts, max_new_tokens=10, generator=torch.Generator().manual_seed(0))
    assert out.completion_ids.shape[0] == 8 and out.completion_mask.dtype == torch.long
    lp, ent = sequence_logps(model, out.prompt_ids, out.prompt_mask, out.completion_ids,
                             out.completion_mask)
    assert torch.allclose(lp, out.logps, atol=1e-5) and torch.allclose(ent, out.entropies, atol=1e-4)
    # a prompt's completion does not depend on the other prompts in the batch (padding is masked)
    single = generate(model, tok, prompts[1:2], max_new_tokens=10, greedy=True)
    batched = generate(model, tok, prompts[:4], max_new_tokens=10, greedy=True)
    assert single.texts[0] == batched.texts[1]


def test_eos_stops_and_masks(tiny_lm):
    model, tok = tiny_lm
    with torch.no_grad():  # make eos the only likely token
        model.lm_head.weight[tok.eos_token_id] += 50.0
    try:
        out = generate(model, tok, [chat(tok, "1=")] * 3, max_new_tokens=8)
        assert out.completion_ids.shape[1] == 1 and out.completion_mask.tolist() == [[1]] * 3
        assert out.texts == ["", "", ""]
    finally:
        with torch.no_grad():
            model.lm_head.weight[tok.eos_token_id] -= 50.0
