"""Rollouts: batched generation with log-probs, and the one place masks are built.

``generate`` samples completions for a batch of prompts with the KV cache: one forward pass over
the left-padded prompts, then one token per step for the whole batch. It returns the per-token
log-probs (of the distribution actually sampled from, i.e. after the temperature), entropies, and
``completion_mask``, which is 1 up to and including the first end-of-sequence token.

``sequence_logps`` recomputes the per-token log-probs of given completions with gradients: the
training forward pass (one pass over prompt + completion).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


@dataclass
class Generation:
    prompt_ids: Tensor  # (B, P) left-padded
    prompt_mask: Tensor  # (B, P)
    completion_ids: Tensor  # (B, T) right-padded with pad_id
    completion_mask: Tensor  # (B, T) 1 up to and including the first eos
    logps: Tensor  # (B, T) log pi(token) under the sampling distribution
    entropies: Tensor  # (B, T) entropy of the sampling distribution at each step
    texts: list[str]  # decoded completions, special tokens and padding removed


def encode_prompts(tokenizer, prompts: list[str], device="cpu") -> tuple[Tensor, Tensor]:
    """Left-pad already-formatted prompt strings into (ids, mask), both (B, P)."""
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    return enc["input_ids"].to(device), enc["attention_mask"].to(device)


def completion_mask_from_ids(completion_ids: Tensor, eos_id: int) -> Tensor:
    """1 for every token up to and including the first ``eos_id`` of each row, 0 after.

    >>> completion_mask_from_ids(torch.tensor([[5, 2, 7], [5, 6, 7]]), eos_id=2).tolist()
    [[1, 1, 0], [1, 1, 1]]
    """
    is_eos = completion_ids == eos_id  # (B, T)
    eos_before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()  # eos strictly before t
    return (eos_before == 0).long()


@torch.no_grad()
def generate(model, tokenizer, prompts: list[str], max_new_tokens: int = 16,
             temperature: float = 1.0, greedy: bool = False,
             generator: torch.Generator | None = None) -> Generation:
    """Sample one completion per prompt (repeat prompts for a group). Uses the KV cache."""
    device = next(model.parameters()).device
    prompt_ids, prompt_mask = encode_prompts(tokenizer, prompts, device)
    B = prompt_ids.shape[0]
    eos_id, pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    attn = prompt_mask.clone()
    pos = (attn.cumsum(-1) - 1).clamp(min=0)  # (B, P) positions ignore left padding
    out = model(input_ids=prompt_ids, attention_mask=attn, position_ids=pos, use_cache=True)
    cache, logits = out.past_key_values, out.logits[:, -1]  # (B, V)
    next_pos = pos[:, -1:] + 1  # (B, 1)
    done = torch.zeros(B, dtype=torch.bool, device=device)
    ids, logps, ents = [], [], []
    for _ in range(max_new_tokens):
        logp_all = F.log_softmax(logits.float() / max(temperature, 1e-8), -1)  # (B, V)
        if greedy:
            tok = logp_all.argmax(-1)
        else:
            probs = logp_all.exp()
            if generator is not None and generator.device != probs.device:
                # a CPU generator with a CUDA model: sample where the generator lives (seeded
                # sampling stays reproducible); the CPU path below is the common one
                tok = torch.multinomial(probs.to(generator.device), 1, generator=generator)
                tok = tok.squeeze(-1).to(device)
            else:
                tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (B,)
        tok = torch.where(done, torch.full_like(tok, pad_id), tok)
        ids.append(tok)
        logps.append(logp_all.gather(-1, tok[:, None]).squeeze(-1))
        ents.append(-(logp_all.exp() * logp_all).sum(-1))
        done = done | (tok == eos_id)
        if done.all():
            break
        attn = torch.cat([attn, torch.ones(B, 1, dtype=attn.dtype, device=device)], 1)
        out = model(input_ids=tok[:, None], attention_mask=attn, position_ids=next_pos,
                    past_key_values=cache, use_cache=True)
        cache, logits, next_pos = out.past_key_values, out.logits[:, -1], next_pos + 1
    completion_ids = torch.stack(ids, 1)  # (B, T)
    mask = completion_mask_from_ids(completion_ids, eos_id)
    logps_t = torch.stack(logps, 1) * mask
    ents_t = torch.stack(ents, 1) * mask
    texts = tokenizer.batch_decode(completion_ids * mask + pad_id * (1 - mask),
                                   skip_special_tokens=True)
    return Generation(prompt_ids, prompt_mask, completion_ids, mask, logps_t, ents_t, texts)


def sequence_logps(model, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                   completion_mask: Tensor, temperature: float = 1.0) -> tuple[Tensor, Tensor]:
    """Per-token log-probs and entropies of ``completion_ids`` given the prompts, with gradients.

    Returns (logps, entropies), each (B, T), zero where completion_mask is 0.
    """
    ids = torch.cat([prompt_ids, completion_ids], 1)  # (B, P+T)
    attn = torch.cat([prompt_mask, completion_mask], 1)  # (B, P+T)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits  # (B, P+T, V)
    P, T = prompt_ids.shape[1], completion_ids.shape[1]
    logits = logits[:, P - 1:P + T - 1].float() / temperature  # predicts each completion token
    logp_all = F.log_softmax(logits, -1)  # (B, T, V)
    logps = logp_all.gather(-1, completion_ids[..., None]).squeeze(-1)  # (B, T)
    ents = -(logp_all.exp() * logp_all).sum(-1)  # (B, T)
    m = completion_mask.to(logps.dtype)
    return logps * m, ents * m
