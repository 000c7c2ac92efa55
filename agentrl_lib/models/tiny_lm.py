"""The tiny causal LM: a standard transformers architecture (Qwen2), the project's own tokenizers
and a ChatML chat template. Nothing here downloads weights; ``agentrl_lib.models.loading.load_policy``
loads this model or any other causal LM by name or folder.

Two tokenizers (``load_tokenizer(kind)``):
- ``"bpe"`` (the default): a byte-level BPE of 2048 tokens trained on the project's own corpora
  (``algorithms.subword`` builds it; the files live in ``models/bpe/``), digits split one per token
  as Qwen's and Llama 1/2's tokenizers do (Llama 3 groups up to three digits), newlines split too,
  and merges allowed across words, so a recurring phrase of an observation (". The goal is at
  row ") is one token. Its chat template is
  TRL's bundled Qwen2.5 template, verbatim, which TRL's tool-calling path recognises. Models on it
  get ``CONTEXT["bpe"]`` = 2048 positions.
- ``"char"``: one token per character, the first substrate; kept for notebook 10's comparison and
  for the bases built on it (512 positions).

Sizes (hidden, layers, heads, MLP) are named so profiles can pick them:
``tiny-64`` (2 layers, 0.1M parameters: CPU notebooks), ``small-128`` (4 layers), ``base-256``
(6 layers), ``medium-512`` (8 layers, 34M parameters: pretrained on a GPU, ``sft.PretrainConfig``).
"""

from __future__ import annotations

import string
from pathlib import Path

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


BPE_DIR = Path(__file__).resolve().parent / "bpe"
"""the BPE tokenizer's files (``tokenizer.json``, ``chat_template.jinja``), written by
``algorithms.subword.build`` and shipped in the package"""
BPE_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
"""the BPE tokenizer's special tokens, Qwen's names: pad, turn start, turn end (= eos)"""
TOKENIZERS = ("bpe", "char")
CONTEXT = {"bpe": 2048, "char": 512}
"""the positions a fresh model gets on each tokenizer (rotary positions: no parameters)"""


def load_tokenizer(kind: str = "bpe"):
    """The project's tokenizer of that kind (``TOKENIZERS``), a ``PreTrainedTokenizerFast``.

    >>> tok = load_tokenizer("bpe")
    >>> tok.convert_ids_to_tokens(tok("at row 12.")["input_ids"])  # digits one per token
    ['atĠ', 'rowĠ', '1', '2', '.']
    """
    if kind == "char":
        return char_tokenizer()
    if kind != "bpe":
        raise ValueError(f"unknown tokenizer {kind!r}; choose one of {list(TOKENIZERS)}")
    from transformers import PreTrainedTokenizerFast

    if not (BPE_DIR / "tokenizer.json").is_file():
        raise FileNotFoundError(f"no BPE tokenizer at {BPE_DIR}: rebuild it with "
                                f"`agentrl tokenizer --rebuild`")
    return bpe_tokenizer((BPE_DIR / "tokenizer.json").read_text(),
                         (BPE_DIR / "chat_template.jinja").read_text())


def bpe_tokenizer(tokenizer_json: str, chat_template: str):
    """Wrap a trained ``tokenizers`` BPE (its JSON) as the project's ``PreTrainedTokenizerFast``:
    pad ``<|endoftext|>``, eos ``<|im_end|>``, left padding, the given chat template."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(tokenizer_json), pad_token="<|endoftext|>",
        eos_token="<|im_end|>", additional_special_tokens=["<|im_start|>"], padding_side="left",
        model_max_length=CONTEXT["bpe"])
    tok.chat_template = chat_template
    return tok


CHAR_SPLIT = {"type": "Split", "pattern": {"Regex": r"[\s\S]"}}
"""the character tokenizer's pre-tokenizer (how ``kind_of`` and ``loading`` recognise it)"""


def is_char_pre_tokenizer(pre: dict | None) -> bool:
    """Whether a ``tokenizer.json``'s ``pre_tokenizer`` entry is the character tokenizer's split."""
    pre = pre or {}
    return all(pre.get(k) == v for k, v in CHAR_SPLIT.items())


def kind_of(tokenizer) -> str:
    """'char' for the character tokenizer, else 'bpe' (any other tokenizer counts as subword)."""
    import json

    pre = json.loads(tokenizer.backend_tokenizer.to_str()).get("pre_tokenizer")
    return "char" if is_char_pre_tokenizer(pre) else "bpe"


def char_tokenizer():
    """Character-level tokenizer: one token per character of ``CHARS`` plus the special tokens.

    >>> tok = char_tokenizer()
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


def model_config(size: str = "tiny-64", vocab_size: int | None = None,
                 max_positions: int | None = None, tokenizer=None):
    """A ``Qwen2Config`` of the named size; special-token ids taken from the tokenizer (default
    the BPE one), positions ``CONTEXT`` of the tokenizer's kind unless given."""
    from transformers import Qwen2Config

    if size not in SIZES:
        raise ValueError(f"unknown tiny model size {size!r}; choose one of {list(SIZES)}")
    tok = tokenizer or load_tokenizer()
    s = SIZES[size]
    return Qwen2Config(
        vocab_size=vocab_size or len(tok),
        max_position_embeddings=max_positions or CONTEXT[kind_of(tok)],
        num_key_value_heads=s["num_attention_heads"], tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
        rms_norm_eps=1e-6, rope_theta=10000.0, **s,
    )


def new_model(size: str = "tiny-64", seed: int = 0, tokenizer=None):
    """A freshly initialised tiny Qwen2 causal LM (deterministic in ``seed``) and its tokenizer:
    ``tokenizer`` a tokenizer object, or a kind of ``TOKENIZERS`` (default "bpe")."""
    import torch
    from transformers import Qwen2ForCausalLM

    tok = load_tokenizer(tokenizer or "bpe") if tokenizer is None or isinstance(tokenizer, str) \
        else tokenizer
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(model_config(size, tokenizer=tok))
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok
