"""The tiny causal LM: a standard transformers architecture (Qwen2), a character-level tokenizer
built locally with ``tokenizers``, a chat template, and loading of any causal LM by name or folder.

Nothing here downloads weights. ``load_policy("agentrl/tiny-64")`` builds (or loads from the cache)
the project's own model; ``load_policy("/path/to/checkpoint")`` or a hub name goes through
``from_pretrained`` exactly as for any Hugging Face causal LM.

Sizes (hidden, layers, heads, MLP) are named so profiles can pick them:
``tiny-64`` (2 layers, CPU notebooks), ``small-128`` (4 layers, cpu profile), ``base-256``
(6 layers, GPU without a real model).
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
}
BUILTIN_PREFIX = "agentrl/"
SFT_PREFIX = "agentrl-sft/"


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


def is_char_tokenizer(folder) -> bool:
    """True when ``folder/tokenizer.json`` holds this project's character-level tokenizer.

    Needed because transformers 5's ``AutoTokenizer`` rebuilds the tokenizer from the model type in
    config.json (qwen2 -> a byte-level BPE pre-tokenizer), silently dropping our single-character
    split: newlines vanish and the model sees text it was never trained on.
    """
    import json

    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        return False
    pre = json.loads(path.read_text()).get("pre_tokenizer") or {}
    return pre.get("type") == "Split" and pre.get("pattern") == {"Regex": r"[\s\S]"}


def load_policy(name_or_path: str, device: str = "cpu", dtype=None, **builtin_kwargs):
    """Load a causal LM and its tokenizer.

    - ``agentrl/<size>`` (e.g. ``agentrl/tiny-64``): the project's tiny model, freshly initialised
      (``builtin_kwargs`` go to ``new_model``).
    - ``agentrl-sft/<name>`` (e.g. ``agentrl-sft/arith-tiny``): a named SFT base model of
      ``agentrl_lib.models.sft.BASE_MODELS``, trained on first use and cached.
    - a local folder or a hub name: ``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer``.
      A missing folder that is not a reachable hub name raises ``FileNotFoundError`` naming it.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if name_or_path.startswith(SFT_PREFIX):
        from agentrl_lib.models.sft import base_config, sft_checkpoint

        name_or_path = str(sft_checkpoint(base_config(name_or_path[len(SFT_PREFIX):])))
    elif name_or_path.startswith(BUILTIN_PREFIX):
        model, tok = new_model(name_or_path[len(BUILTIN_PREFIX):], **builtin_kwargs)
        return model.to(device=device, dtype=dtype or torch.float32), tok
    path = Path(name_or_path).expanduser()
    looks_local = path.is_absolute() or name_or_path.startswith((".", "~")) or path.exists()
    if looks_local and not (path / "config.json").is_file():
        raise FileNotFoundError(f"no checkpoint at {path}: expected a folder with config.json "
                                f"(saved by save_pretrained)")
    try:
        if is_char_tokenizer(path):
            from transformers import PreTrainedTokenizerFast

            tok = PreTrainedTokenizerFast.from_pretrained(name_or_path)
        else:
            tok = AutoTokenizer.from_pretrained(name_or_path)
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype or "auto")
    except OSError as e:
        raise FileNotFoundError(
            f"could not load {name_or_path!r} with from_pretrained: not a local checkpoint folder, "
            f"and the hub could not provide it ({str(e).splitlines()[0]})") from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return model.to(device), tok
