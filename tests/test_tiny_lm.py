"""The tiny LM substrate: tokenizer, save/load through from_pretrained, generation with the KV cache."""

import pytest
import torch

from agentrl_lib.models.loading import load_policy
from agentrl_lib.algorithms import subword
from agentrl_lib.models.tiny_lm import (BPE_DIR, CONTEXT, char_tokenizer, kind_of, load_tokenizer,
                                        new_model)
from agentrl_lib.rollout import completion_mask_from_ids, generate, sequence_logps


def chat(tok, content):
    return tok.apply_chat_template([{"role": "user", "content": content}],
                                   add_generation_prompt=True, tokenize=False)


def test_tokenizer_roundtrip_and_template():
    tok = char_tokenizer()
    text = "Q: 12*(3+4)=?\nA: 84"
    assert tok.decode(tok(text)["input_ids"]) == text
    assert len(tok(text)["input_ids"]) == len(text)  # one token per character
    s = chat(tok, "1+1=")
    assert s == "<|im_start|>user\n1+1=<|im_end|>\n<|im_start|>assistant\n"
    assert tok.convert_ids_to_tokens(tok(s)["input_ids"])[0] == "<|im_start|>"


def test_bpe_tokenizer_splits_digits_and_saves_tokens():
    tok = load_tokenizer("bpe")
    assert len(tok) == subword.VOCAB_SIZE and tok.eos_token == "<|im_end|>"
    text = "Turn 12/40. You are at row 3, column 2.\nanswer 1234"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text
    pieces = tok.convert_ids_to_tokens(ids)
    assert [p for p in pieces if any(c.isdigit() for c in p)] == list("1240321234")
    assert len(ids) * 2 < len(text)  # recurring phrases are single tokens
    assert kind_of(tok) == "bpe" and kind_of(char_tokenizer()) == "char"
    model, _ = new_model("tiny-64", seed=0)
    assert model.config.max_position_embeddings == CONTEXT["bpe"] == 2048
    assert new_model("tiny-64", tokenizer="char")[0].config.max_position_embeddings == 512
    with pytest.raises(ValueError, match="unknown tokenizer 'word'"):
        load_tokenizer("word")


def test_bpe_template_is_the_one_trl_recognises():
    from trl.chat_template_utils import (add_response_schema, is_chat_template_prefix_preserving,
                                         parse_response, qwen2_5_chat_template,
                                         supports_tool_calling)

    tok = load_tokenizer("bpe")
    assert tok.chat_template == qwen2_5_chat_template
    assert supports_tool_calling(tok) and is_chat_template_prefix_preserving(tok)
    tok = add_response_schema(tok)  # matches templates by equality, raises on an unknown one
    call = '<tool_call>\n{"name": "move", "arguments": {"direction": "left"}}\n</tool_call><|im_end|>'
    prefix = tok("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
    parsed = parse_response(tok, tok(call)["input_ids"], prefix=prefix)
    assert parsed["tool_calls"][0]["function"] == {"name": "move", "arguments": {"direction": "left"}}


def test_shipped_bpe_tokenizer_is_what_the_corpus_builds(tmp_path):
    """The files in models/bpe are exactly what ``subword.build`` writes (deterministic)."""
    subword.build(tmp_path)
    for name in ("tokenizer.json", "chat_template.jinja"):
        assert (tmp_path / name).read_text() == (BPE_DIR / name).read_text(), name


def test_save_and_load_from_pretrained(tiny_lm, tmp_path):
    model, tok = tiny_lm
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    model2, tok2 = load_policy(str(tmp_path))
    x = torch.tensor([tok(chat(tok, "7+8="))["input_ids"]])
    assert torch.allclose(model(x).logits, model2.eval()(x).logits, atol=1e-6)
    assert tok2.decode(x[0]) == tok.decode(x[0])
    # encoding too, with config.json beside the tokenizer (AutoTokenizer would rebuild a qwen2
    # tokenizer from it: the character split's newlines, the BPE's cross-word merges, gone)
    text = chat(tok, "12 + 34 =\nok. You are at row 3, column 2.")
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
