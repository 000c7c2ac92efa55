"""The tiny causal LM: a standard transformers architecture (Qwen2), a character-level tokenizer
built locally with ``tokenizers``, and a chat template (ChatML). Nothing here downloads weights;
``agentrl_lib.models.loading.load_policy`` loads this model or any other causal LM by name or folder.

Sizes (hidden, layers, heads, MLP) are named so profiles can pick them:
``tiny-64`` (2 layers, 0.1M parameters: CPU notebooks), ``small-128`` (4 layers), ``base-256``
(6 layers), ``medium-512`` (8 layers, 34M parameters: pretrained on a GPU, ``sft.PretrainConfig``).
"""

from __future__ import annotations

import string

SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>", "<|unk|>"]
CHARS = string.digits + string.ascii_letters + " \n+-*/=()<>[]{}.,:;!?'\"_#|@$%&^~`\\"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SIZES = {
    "tiny-64": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=256),
    "small-128": dict(hidden_size=128, num_hidden_layers=4, num_attention_heads=4, intermediate_size=512),
    "base-256": dict(hidden_size=256, num_hidden_layers=6, num_attention_heads=8, intermediate_size=1024),
    "medium-512": dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, intermediate_size=2048),
}


def build_tokenizer():
    """Character-level tokenizer: one token per character of ``CHARS`` plus the special tokens.

    >>> tok = build_tokenizer()
    >>> ids = tok("12+7=")["input_ids"]; len(ids), tok.decode(ids)
    (5, '12+7=')
    >>> tok.convert_ids_to_tokens(tok("<|im_end|>a")["input_ids"])
    ['<|im_end|>', 'a']
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    for ch in CHARS:
        vocab.setdefault(ch, len(vocab))
    core = Tokenizer(models.WordLevel(vocab, unk_token="<|unk|>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<|pad|>", bos_token="<|bos|>", eos_token="<|im_end|>",
        unk_token="<|unk|>", additional_special_tokens=["<|eos|>", "<|im_start|>"],
        padding_side="left", model_max_length=1024,
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def model_config(size: str = "tiny-64", vocab_size: int | None = None, max_positions: int = 512,
                 tokenizer=None):
    """A ``Qwen2Config`` of the named size; special-token ids taken from the tokenizer."""
    from transformers import Qwen2Config

    if size not in SIZES:
        raise ValueError(f"unknown tiny model size {size!r}; choose one of {list(SIZES)}")
    tok = tokenizer or build_tokenizer()
    s = SIZES[size]
    return Qwen2Config(
        vocab_size=vocab_size or len(tok), max_position_embeddings=max_positions,
        num_key_value_heads=s["num_attention_heads"], tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        rms_norm_eps=1e-6, rope_theta=10000.0, **s,
    )


def new_model(size: str = "tiny-64", seed: int = 0, tokenizer=None):
    """A freshly initialised tiny Qwen2 causal LM (deterministic in ``seed``) and its tokenizer."""
    import torch
    from transformers import Qwen2ForCausalLM

    tok = tokenizer or build_tokenizer()
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(model_config(size, tokenizer=tok))
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok
