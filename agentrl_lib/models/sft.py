"""Supervised fine-tuning of the tiny LM on the project's synthetic tasks, cached by config.

``sft_checkpoint(SFTConfig(...))`` returns the path of a ``save_pretrained`` folder, training it
first if the cache has none. The cache key is a hash of the config (and ``FORMAT_VERSION``), so
notebooks that ask for the same base model share it. A cache entry that is missing files or does
not load is rebuilt, with a message saying so. Writes are atomic: a temporary folder renamed into
place, so a killed run never leaves a half-written checkpoint that looks complete.

The loss is the next-token cross-entropy on the assistant's tokens only (prompt tokens masked),
as in TRL's ``SFTTrainer`` with ``completion_only_loss``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

FORMAT_VERSION = 1


@dataclass
class SFTConfig:
    size: str = "tiny-64"
    """named model size (see tiny_lm.SIZES)"""
    task: str = "arithmetic"
    """task family the model is fine-tuned on (text_tasks.GENERATORS)"""
    difficulties: tuple = (1, 2)
    """difficulties mixed in the SFT data"""
    num_problems: int = 4000
    """distinct training problems (train split only; the held-out split is never seen)"""
    steps: int = 400
    """optimizer steps"""
    batch_size: int = 64
    lr: float = 3e-3
    """AdamW learning rate, linear warm-up over 5% then cosine decay"""
    seed: int = 0


# The named base models that notebooks share (``load_policy("agentrl-sft/<name>")``).
# arith-tiny: 1500 steps reach about 30% greedy held-out accuracy on 2-digit arithmetic (measured
# on the 200-problem panel; 18% sampled at temperature 1): room for RL to show a gain.
BASE_MODELS = {
    "arith-tiny": SFTConfig(size="tiny-64", task="arithmetic", difficulties=(1, 2), steps=1500),
    "chain-tiny": SFTConfig(size="tiny-64", task="chain", difficulties=(1, 2, 3), steps=1500),
    "arith-small": SFTConfig(size="small-128", task="arithmetic", difficulties=(1, 2, 3),
                             steps=3000, lr=1e-3),
}


def base_config(name: str) -> SFTConfig:
    if name not in BASE_MODELS:
        raise ValueError(f"unknown base model {name!r}; the built-in ones are {list(BASE_MODELS)}")
    return BASE_MODELS[name]


def cache_root() -> Path:
    return Path(os.environ.get("AGENTRL_CACHE") or Path.home() / ".cache" / "agentrl")  # empty = unset


def config_key(cfg: SFTConfig) -> str:
    blob = json.dumps({"v": FORMAT_VERSION, **asdict(cfg)}, sort_keys=True, default=list)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def format_example(tokenizer, prompt: str, completion: str) -> tuple[list[int], list[int]]:
    """Token ids of chat(prompt) + completion + eos, and the loss mask (1 on completion + eos)."""
    p = tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                      add_generation_prompt=True, tokenize=False)
    p_ids = tokenizer(p, add_special_tokens=False)["input_ids"]
    c_ids = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return p_ids + c_ids, [0] * len(p_ids) + [1] * len(c_ids)


def train_sft(cfg: SFTConfig, log_every: int = 50, verbose: bool = True):
    """Train from scratch; returns (model, tokenizer, list of (step, loss))."""
    import math
    import random

    import torch

    from agentrl_lib.envs.text_tasks import make_problems, reference_completion
    from agentrl_lib.models.tiny_lm import new_model

    model, tok = new_model(cfg.size, seed=cfg.seed)
    per = max(1, cfg.num_problems // len(cfg.difficulties))
    problems = [p for d in cfg.difficulties
                for p in make_problems(cfg.task, per, d, "train", seed=cfg.seed, strict=False)]
    examples = [format_example(tok, p["prompt"], reference_completion(p)) for p in problems]
    rng = random.Random(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    warm = max(1, cfg.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / cfg.steps))))
    history = []
    model.train()
    for step in range(cfg.steps):
        batch = rng.sample(examples, min(cfg.batch_size, len(examples)))
        loss = masked_nll(model, batch, tok.pad_token_id)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % log_every == 0 or step == cfg.steps - 1:
            history.append((step, loss.item()))
            if verbose:
                print(f"  sft step {step:4d}  loss {loss.item():.4f}", flush=True)
    model.eval()
    return model, tok, history


def masked_nll(model, batch: list[tuple[list[int], list[int]]], pad_id: int):
    """Mean next-token NLL over the tokens whose mask is 1, for a batch of (ids, mask) examples
    right-padded together (fine for teacher forcing): the SFT loss of every warm-start here."""
    import torch

    T = max(len(x) for x, _ in batch)
    ids = torch.full((len(batch), T), pad_id)
    mask = torch.zeros(len(batch), T)
    attn = torch.zeros(len(batch), T, dtype=torch.long)
    for i, (x, m) in enumerate(batch):
        ids[i, :len(x)], mask[i, :len(m)], attn[i, :len(x)] = torch.tensor(x), torch.tensor(
            m, dtype=torch.float), 1
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]  # (B, T-1, V)
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
    return (nll * mask[:, 1:]).sum() / mask[:, 1:].sum()


def sft_checkpoint(cfg: SFTConfig, verbose: bool = True) -> Path:
    """The cached checkpoint folder for ``cfg``, trained first when missing or unreadable."""
    path = cache_root() / "sft" / f"{cfg.size}-{cfg.task}-{config_key(cfg)}"
    meta = path / "agentrl_sft.json"
    if meta.is_file():
        try:
            from transformers import AutoConfig

            AutoConfig.from_pretrained(path)
            if json.loads(meta.read_text())["config"] == json.loads(json.dumps(asdict(cfg), default=list)):
                return path
            problem = "its recorded config differs"
        except Exception as e:  # noqa: BLE001 - any unreadable cache entry is rebuilt
            problem = f"it does not load ({type(e).__name__}: {e})"
        if verbose:
            print(f"cached SFT model at {path} is unusable: {problem}; rebuilding it")
    elif path.exists() and verbose:
        print(f"cached SFT model at {path} is incomplete; rebuilding it")
    if verbose:
        print(f"training the SFT base model {cfg} (cached at {path} afterwards)")
    t0 = time.time()
    model, tok, history = train_sft(cfg, verbose=verbose)
    save_checkpoint(model, tok, path, {"config": asdict(cfg), "history": history,
                                       "train_s": round(time.time() - t0, 1)})
    return path


def save_checkpoint(model, tokenizer, path: Path, meta: dict) -> Path:
    """Write model, tokenizer and ``agentrl_sft.json`` (``meta``) to ``path`` atomically: into a
    temp folder first, renamed into place, so a killed build never leaves a half checkpoint."""
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "agentrl_sft.json").write_text(json.dumps(meta, indent=2, default=list))
    shutil.rmtree(path, ignore_errors=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, path)
    return path


def load_sft(cfg: SFTConfig, device: str = "cpu", verbose: bool = True):
    """(model, tokenizer) of the cached SFT checkpoint, loaded through ``load_policy``."""
    from agentrl_lib.models.tiny_lm import load_policy

    model, tok = load_policy(str(sft_checkpoint(cfg, verbose)), device=device)
    return model.eval(), tok
