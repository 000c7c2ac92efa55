"""Rollouts: the one place where token sequences, masks and log-probs are built, single- and
multi-turn, and the multi-turn ``Episode`` record for every policy from a table to an LM.

**Sequences.** ``Generation`` is the padded record every LM update trains on: prompts left-padded
(``prompt_ids``, ``prompt_mask``, (B, P)), what follows right-padded (``completion_ids``, (B, T)),
``completion_mask`` 1 on every real token after the prompt, ``loss_mask`` 1 on the tokens the policy
generated, and the sampling ``logps``. Single-turn, the completion is the answer and the two masks
are equal; multi-turn (``pad_episodes``), the completion is the rest of the conversation and
``loss_mask`` is 1 only on the agent's actions, never on observations or template tokens.

**Sampling.** One decoder on a KV cache serves both: ``generate`` prefills the prompts and decodes
one completion each (the one-turn case); ``lm_rollout`` keeps the cache across turns and feeds only
each turn's new tokens. Log-probs are those of the distribution actually sampled from (after the
temperature). ``sequence_logps`` recomputes them with gradients: the training forward pass.

**The conversation record.** A conversation is rendered with the tokenizer's chat template
(ChatML for the tiny LM) and kept as token ids, never re-tokenised::

    prompt_ids : <|im_start|>system\\n{system}<|im_end|>\\n<|im_start|>user\\n{o_0}<|im_end|>\\n<|im_start|>assistant\\n
    token_ids  : {a_0}<|im_end|> \\n<|im_start|>user\\n{o_1}<|im_end|>\\n<|im_start|>assistant\\n {a_1}<|im_end|> ...
    loss_mask  :  1 1 1 ...  1     0 0 0 ...                                        0   1 1 ...   1

``turn_spans[t]`` is the [start, end) of action t in ``token_ids``. An action cut by
``max_new_tokens`` gets an end-of-turn token appended as a template token (mask 0), so the
conversation stays well-formed. The environment's final observation is never seen by the agent and
is not in ``token_ids``.

**The batched multi-turn rollout.** All running environments are stepped together. Each turn feeds
only the new tokens of every running conversation (the previous action's unfed last token and the
observation segment), left-padded to a common length with attention 0 on the padding, then decodes
the actions one token per step for the whole batch. Padding therefore sits *inside* the cached
sequence (mask 0, never attended); positions count real tokens only, so each row sees exactly the
positions and attention of its own unpadded conversation. Finished conversations leave the batch.
``naive_rollout`` plays the same episodes one at a time and re-encodes the whole conversation each
turn: the loop one would write first, kept for the benchmark and as a reference in the tests.

**SFT examples.** ``chat_example`` and ``messages_example`` give (ids, loss mask) pairs of a
prompt and its reference completion or of a whole tool-calling conversation; ``pad_examples``
right-pads them for teacher forcing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F

from agentrl_lib.utils import progress

Tensor = torch.Tensor


# --- chat formatting ------------------------------------------------------------------------------
def token_ids(tokenizer, text: str) -> list[int]:
    """The ids of ``text`` with no special tokens added (the template's markers are in the text)."""
    return tokenizer(text, add_special_tokens=False)["input_ids"]


_PROBES = ("\n  \u00a4probe-1 {{ x }} %} <&'\"> \t", " \u00a4probe-2\n")
_FRAMES: dict = {}
"""(head, tail) of each template rendering, by (kind, template, special tokens, system prompt)"""


def _framed(tokenizer, kind: str, system_prompt, render, content: str) -> str:
    """``render(content)`` as ``head + content + tail``, the frame rendered once per template and
    system prompt: a chat template that inserts a message's content verbatim (checked with two
    probes with edge whitespace and template syntax) renders every content the same way around it,
    and the jinja rendering is most of a multi-turn rollout's tokenizer time. A template that does
    not (trims, escapes, branches on the content) is rendered each time."""
    key = (kind, tokenizer.chat_template, tokenizer.eos_token, tokenizer.bos_token, system_prompt)
    if key not in _FRAMES:
        frames = []
        for probe in _PROBES:
            text = render(probe)
            at = text.find(probe)
            frames.append((text[:at], text[at + len(probe):]) if text.count(probe) == 1 else None)
        _FRAMES[key] = frames[0] if frames[0] is not None and frames[0] == frames[1] else None
    frame = _FRAMES[key]
    return render(content) if frame is None else frame[0] + content + frame[1]


def format_prompts(tokenizer, problems: list[dict]) -> list[str]:
    """Each problem's ``prompt`` as a one-message chat, ready for the assistant's answer; a problem
    with a non-empty ``system_prompt`` is rendered as an agent base's first prompt
    (``prompt_text``: that system message, then the prompt as the first observation)."""
    def render(x):
        return tokenizer.apply_chat_template([{"role": "user", "content": x}],
                                             add_generation_prompt=True, tokenize=False)
    return [prompt_text(tokenizer, p["prompt"], p["system_prompt"]) if p.get("system_prompt")
            else _framed(tokenizer, "prompt", None, render, p["prompt"]) for p in problems]


def prompt_text(tokenizer, observation: str, system_prompt: str | None = None) -> str:
    """The first prompt: system message (if any) + the first observation + the generation prompt."""
    sys = [{"role": "system", "content": system_prompt}] if system_prompt else []

    def render(x):
        return tokenizer.apply_chat_template(sys + [{"role": "user", "content": x}],
                                             add_generation_prompt=True, tokenize=False)
    return _framed(tokenizer, "first", system_prompt or None, render, observation)


def observation_text(tokenizer, observation: str, system_prompt: str | None = None) -> str:
    """The template text between an assistant's end-of-turn token and the next generation: for
    ChatML ``"\\n<|im_start|>user\\n{obs}<|im_end|>\\n<|im_start|>assistant\\n"``. Derived from the
    template itself (rendered with and without the new user turn), so other templates work as long
    as they render a conversation as a prefix of its continuation."""
    return _framed(tokenizer, "next", system_prompt or None,
                   lambda x: _observation_text(tokenizer, x, system_prompt), observation)


def _observation_text(tokenizer, observation: str, system_prompt: str | None = None) -> str:
    sys = [{"role": "system", "content": system_prompt}] if system_prompt else []
    base = sys + [{"role": "user", "content": "o"}, {"role": "assistant", "content": "A"}]
    r1 = tokenizer.apply_chat_template(base, tokenize=False)
    r2 = tokenizer.apply_chat_template(base + [{"role": "user", "content": observation}],
                                       add_generation_prompt=True, tokenize=False)
    end = "A" + tokenizer.eos_token
    cut = r1.rfind(end)
    if cut < 0 or not r2.startswith(r1[:cut + len(end)]):
        raise ValueError("the chat template does not render an assistant turn as 'content + eos' "
                         "followed by a prefix-stable continuation; lm_rollout needs that")
    return r2[cut + len(end):]


# --- SFT examples: (ids, loss mask) pairs ----------------------------------------------------------
def chat_example(tokenizer, prompt: str, completion: str) -> tuple[list[int], list[int]]:
    """Token ids of chat(prompt) + completion + eos, and the loss mask (1 on completion + eos)."""
    p_ids = token_ids(tokenizer, format_prompts(tokenizer, [{"prompt": prompt}])[0])
    c_ids = token_ids(tokenizer, completion) + [tokenizer.eos_token_id]
    return p_ids + c_ids, [0] * len(p_ids) + [1] * len(c_ids)


def messages_example(tokenizer, messages: list[dict], tools=None,
                     header: str = "<|im_start|>assistant\n") -> tuple[list[int], list[int]]:
    """Token ids of a whole conversation and the loss mask: 1 on what each assistant message adds
    to the rendering (its content, tool calls and end-of-turn token), 0 on its ``header`` and on the
    newline after it, and on every other message. ``tools`` go to the chat template."""
    head = len(token_ids(tokenizer, header))
    ids, mask = [], []
    for k in range(1, len(messages) + 1):
        text = tokenizer.apply_chat_template(messages[:k], tools=tools, tokenize=False)
        new = token_ids(tokenizer, text)[len(ids):]
        ids += new
        if messages[k - 1]["role"] != "assistant":
            mask += [0] * len(new)
        else:
            mask += [0] * head + [1] * (len(new) - head - 1) + [0]
    return ids, mask


def pad_examples(examples: list[tuple[list[int], list[int]]], pad_id: int,
                 device) -> tuple[Tensor, Tensor, Tensor]:
    """Right-pad (ids, loss mask) pairs together (fine for teacher forcing): ids, attention mask and
    loss mask, each (B, L), on ``device`` (the model's; built on the host, then one copy each)."""
    L = max(len(x) for x, _ in examples)
    ids = torch.full((len(examples), L), pad_id, dtype=torch.long, device="cpu")
    mask = torch.zeros(len(examples), L, device="cpu")
    attn = torch.zeros(len(examples), L, dtype=torch.long, device="cpu")
    for i, (x, m) in enumerate(examples):
        ids[i, :len(x)] = torch.tensor(x, dtype=torch.long, device="cpu")
        mask[i, :len(m)] = torch.tensor(m, dtype=torch.float, device="cpu")
        attn[i, :len(x)] = 1
    return ids.to(device), attn.to(device), mask.to(device)


# --- the padded record of sampled sequences --------------------------------------------------------
@dataclass
class Generation:
    prompt_ids: Tensor  # (B, P) left-padded
    prompt_mask: Tensor  # (B, P)
    completion_ids: Tensor  # (B, T) right-padded with pad_id
    completion_mask: Tensor  # (B, T) 1 on every real token after the prompt
    logps: Tensor  # (B, T) log pi(token) under the sampling distribution, 0 off loss_mask
    entropies: Tensor | None = None  # (B, T) entropy of the sampling distribution at each step
    texts: list[str] | None = None  # decoded completions, special tokens and padding removed
    loss_mask: Tensor | None = None  # (B, T) 1 on policy tokens; None: completion_mask

    def __post_init__(self):
        if self.loss_mask is None:
            self.loss_mask = self.completion_mask

    def select(self, idx: Tensor) -> "Generation":
        """The rows ``idx`` (a (K,) index tensor) of every field."""
        pick = lambda x: None if x is None else x[idx]  # noqa: E731
        texts = None if self.texts is None else [self.texts[i] for i in idx.tolist()]
        return Generation(self.prompt_ids[idx], self.prompt_mask[idx], self.completion_ids[idx],
                          self.completion_mask[idx], self.logps[idx], pick(self.entropies), texts,
                          self.loss_mask[idx])


def concat_generations(gens: list[Generation], pad_id: int) -> Generation:
    """The rows of several ``Generation``s as one: prompts left-padded to the longest (P), the
    rest right-padded to the longest (T) with ``pad_id`` and zero masks, log-probs and entropies.
    One is returned as it is."""
    if len(gens) == 1:
        return gens[0]
    P = max(g.prompt_ids.shape[1] for g in gens)
    T = max(g.completion_ids.shape[1] for g in gens)

    def cat(field, width, value=0, left=False):
        parts = [getattr(g, field) for g in gens]
        if any(x is None for x in parts):
            return None
        sides = [(width - x.shape[1], 0) if left else (0, width - x.shape[1]) for x in parts]
        return torch.cat([F.pad(x, side, value=value) for x, side in zip(parts, sides)])

    texts = None if any(g.texts is None for g in gens) else [t for g in gens for t in g.texts]
    return Generation(cat("prompt_ids", P, pad_id, left=True), cat("prompt_mask", P, left=True),
                      cat("completion_ids", T, pad_id), cat("completion_mask", T),
                      cat("logps", T), cat("entropies", T), texts, cat("loss_mask", T))


def encode_prompts(tokenizer, prompts: list[str], device) -> tuple[Tensor, Tensor]:
    """Left-pad already-formatted prompt strings into (ids, mask), both (B, P), on ``device``."""
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, padding=True, add_special_tokens=False)  # lists: no default device
    return (torch.tensor(enc["input_ids"], dtype=torch.long, device=device),
            torch.tensor(enc["attention_mask"], dtype=torch.long, device=device))


def completion_mask_from_ids(completion_ids: Tensor, eos_id: int) -> Tensor:
    """1 for every token up to and including the first ``eos_id`` of each row, 0 after.

    >>> completion_mask_from_ids(torch.tensor([[5, 2, 7], [5, 6, 7]]), eos_id=2).tolist()
    [[1, 1, 0], [1, 1, 1]]
    """
    is_eos = completion_ids == eos_id  # (B, T)
    eos_before = torch.cumsum(is_eos.long(), dim=1) - is_eos.long()  # eos strictly before t
    return (eos_before == 0).long()


# --- the decoder: a KV cache, prefill and token-by-token sampling ---------------------------------
def model_device(model) -> torch.device:
    """The device of the model's parameters: where every tensor it sees must be built."""
    return next(model.parameters()).device


def token_generator(model, seed: int) -> torch.Generator:
    """A seeded generator for per-token sampling on the model's device, so sampling never copies
    probabilities to the host. The same seed draws other tokens on a GPU than on the CPU."""
    return torch.Generator(device=model_device(model)).manual_seed(seed)


def sample_next(logits: Tensor, temperature: float = 1.0, greedy: bool = False,
                generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """One decoding step: (token (B,), log-probs of the sampling distribution (B, V)) from the
    last position's logits (B, V), at ``temperature`` (greedy: the argmax)."""
    logp_all = F.log_softmax(logits.float() / max(temperature, 1e-8), -1)  # (B, V)
    if greedy:
        return logp_all.argmax(-1), logp_all
    probs = logp_all.exp()
    if generator is not None and generator.device != probs.device:
        # a CPU generator with a CUDA model: sample where the generator lives (seeded sampling
        # stays reproducible) at the cost of a copy per token; ``token_generator`` avoids it
        tok = torch.multinomial(probs.to(generator.device), 1, generator=generator)
        return tok.squeeze(-1).to(logits.device), logp_all
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1), logp_all


@dataclass
class _Cache:
    """The running sequences' KV cache. attn: (B, L) 1 on real tokens (padding sits inside the
    sequence with 0); next_pos: (B,) position of each row's next real token."""
    kv: object = None
    attn: Tensor | None = None
    next_pos: Tensor | None = None
    min_waste: ClassVar[float] = 0.125  # compact only when more than this fraction of columns is padding

    def select(self, idx: Tensor) -> None:
        if self.kv is not None:
            self.kv.batch_select_indices(idx)
            self.attn, self.next_pos = self.attn[idx], self.next_pos[idx]

    def compact(self) -> None:
        """Move each row's cached real tokens to the right end, in order, and drop the columns
        that are then padding in every row: the cache shrinks from the sum of every turn's
        longest segment to the longest row. Attention to a masked column has weight exactly 0
        and the keys carry their rotary positions, so every row attends to the same keys and
        values as before (the sums in another order: rounding)."""
        if self.kv is None or not hasattr(self.kv, "layers"):
            return
        L, n = self.attn.shape[1], int(self.attn.sum(-1).max())
        if L - n <= self.min_waste * L:  # the copy would cost more than the columns it saves
            return
        # a stable sort puts each row's padding first and keeps its real columns in order
        order = torch.sort(self.attn, dim=1, stable=True).indices[:, L - n:]  # (B, n)
        self.attn = self.attn.gather(1, order)
        for layer in self.kv.layers:
            k, v = layer.keys, layer.values  # (B, heads, L, d)
            at = order[:, None, :, None].expand(k.shape[0], k.shape[1], n, k.shape[3])
            layer.keys, layer.values = k.gather(2, at), v.gather(2, at)


def _keeps_logits(model) -> bool:
    """Whether the model's forward takes ``logits_to_keep`` (transformers' causal LMs do)."""
    import inspect

    return "logits_to_keep" in inspect.signature(model.forward).parameters


def _prefill(model, state: _Cache, ids: Tensor, seg_mask: Tensor) -> Tensor:
    """Append left-padded segments ids (B, S) with mask (B, S) to the cache; returns the
    next-token logits (B, V) after each row's last real token."""
    if state.kv is None:
        state.attn = seg_mask
        state.next_pos = torch.zeros(ids.shape[0], dtype=torch.long, device=ids.device)
    else:
        state.attn = torch.cat([state.attn, seg_mask], 1)
    pos = (state.next_pos[:, None] + seg_mask.cumsum(-1) - 1).clamp(min=0)  # (B, S) real tokens only
    # only the last position's logits are read: the output embedding skips the other S - 1
    keep = {"logits_to_keep": 1} if _keeps_logits(model) else {}
    out = model(input_ids=ids, attention_mask=state.attn, position_ids=pos,
                past_key_values=state.kv, use_cache=True, **keep)
    state.kv = out.past_key_values
    state.next_pos = state.next_pos + seg_mask.sum(-1)
    return out.logits[:, -1]


def _feed(model, state: _Cache, segments: list[list[int]], pad_id: int) -> Tensor:
    """``_prefill`` of token-id lists, left-padded to a common length."""
    device = model_device(model)
    S = max(len(s) for s in segments)
    ids = torch.full((len(segments), S), pad_id, dtype=torch.long, device="cpu")
    seg_mask = torch.zeros(len(segments), S, dtype=torch.long, device="cpu")
    for i, s in enumerate(segments):
        ids[i, S - len(s):] = torch.tensor(s, dtype=torch.long, device="cpu")
        seg_mask[i, S - len(s):] = 1
    return _prefill(model, state, ids.to(device), seg_mask.to(device))


def _decode(model, state: _Cache, logits: Tensor, max_new_tokens: int, temperature: float,
            greedy: bool, generator, eos_id: int, pad_id: int):
    """Sample one continuation per row, one token per step for the whole batch, on the cache.
    A row that has sampled ``eos_id`` feeds padding with attention 0 from then on.

    Returns (tokens, logps, entropies), each (B, T) with pad / 0 after a row's eos, and
    ``unfed`` (B,): rows whose last sampled token is not yet in the cache (decoding stopped
    right after it).
    """
    B = logits.shape[0]
    done = torch.zeros(B, dtype=torch.bool, device=logits.device)
    toks, lps, ents = [], [], []
    unfed = done
    for step in range(max_new_tokens):
        tok, logp_all = sample_next(logits, temperature, greedy, generator)  # (B,), (B, V)
        live = ~done  # rows whose token this step is real
        tok = torch.where(live, tok, torch.full_like(tok, pad_id))
        toks.append(tok)
        lps.append(logp_all.gather(-1, tok[:, None]).squeeze(-1))
        ents.append(-(logp_all.exp() * logp_all).sum(-1))
        done = done | (tok == eos_id)
        if done.all() or step == max_new_tokens - 1:
            unfed = live
            break
        # finished rows feed a pad with attention 0: the cache grows in lock-step, they see nothing
        state.attn = torch.cat([state.attn, live.long()[:, None]], 1)
        out = model(input_ids=tok[:, None], attention_mask=state.attn,
                    position_ids=state.next_pos[:, None], past_key_values=state.kv, use_cache=True)
        state.kv, logits = out.past_key_values, out.logits[:, -1]
        state.next_pos = state.next_pos + live.long()
    return torch.stack(toks, 1), torch.stack(lps, 1), torch.stack(ents, 1), unfed


@torch.no_grad()
def action_logps(model, tokenizer, contexts: list[list[int]], actions: list[str],
                 batch_size: int = 64) -> Tensor:
    """log p(a | context) of each action text followed by the end-of-turn token, for every context
    (token ids ending where the answer starts: a ``prompt_text``, or a conversation up to a turn),
    at temperature 1: the sum of the action's next-token log-probs. Each context is encoded once;
    its cache is repeated for the actions, whose tokens (all but the last) are fed left-padded.
    Returns (N, A) float64 on the host."""
    device = model_device(model)
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    conts = [token_ids(tokenizer, a) + [eos] for a in actions]
    A, C = len(actions), max(len(c) for c in conts) - 1
    out = torch.zeros(len(contexts), A, dtype=torch.float64, device="cpu")
    for i in range(0, len(contexts), batch_size):
        chunk = contexts[i:i + batch_size]
        B = len(chunk)
        state = _Cache()
        first = torch.log_softmax(_feed(model, state, chunk, pad).float(), -1)  # (B, V)
        state.kv.batch_repeat_interleave(A)  # row b * A + a: context b, action a
        attn = state.attn.repeat_interleave(A, 0)  # (B*A, L)
        next_pos = state.next_pos.repeat_interleave(A, 0)  # (B*A,)
        ids = torch.full((B * A, C), pad, dtype=torch.long, device=device)
        seg = torch.zeros(B * A, C, dtype=torch.long, device=device)
        for a, c in enumerate(conts):
            if len(c) > 1:
                ids[a::A, C - len(c) + 1:] = torch.tensor(c[:-1], dtype=torch.long, device=device)
                seg[a::A, C - len(c) + 1:] = 1
        pos = (next_pos[:, None] + seg.cumsum(-1) - 1).clamp(min=0)  # (B*A, C) real tokens only
        logits = model(input_ids=ids, attention_mask=torch.cat([attn, seg], 1), position_ids=pos,
                       past_key_values=state.kv, use_cache=True).logits  # (B*A, C, V)
        lp = torch.log_softmax(logits.float(), -1)
        for a, c in enumerate(conts):
            m = len(c) - 1  # the fed tokens at positions C - m .. C - 1 predict c[1:]
            tgt = torch.tensor(c[1:], dtype=torch.long, device=device).expand(B, m)  # (B, m)
            rest = lp[a::A, C - m:].gather(-1, tgt[..., None]).squeeze(-1).sum(-1)  # (B,)
            out[i:i + B, a] = (first[:, c[0]] + rest).to(device="cpu", dtype=torch.float64)
    return out


@torch.no_grad()
def sample_turns(model, tokenizer, contexts: list[list[int]], max_new_tokens: int = 8,
                 temperature: float = 1.0, generator: torch.Generator | None = None,
                 batch_size: int = 64) -> tuple[list[list[int]], list[str]]:
    """One freshly sampled action for each context (token ids ending where the answer starts: a
    ``prompt_text``, or a conversation up to a turn, as ``action_logps`` takes them): the
    contexts are prefilled left-padded and decoded together, as ``lm_rollout`` decodes a turn.
    Returns (rows, texts): each row's sampled ids up to and including its end-of-turn token (all
    ``max_new_tokens`` when none came), and the decoded text (special tokens removed). Replayed
    states with a fresh action (ArCHer's actor, ``archer.lm_train``)."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    rows: list[list[int]] = []
    for i in range(0, len(contexts), batch_size):
        state = _Cache()
        logits = _feed(model, state, contexts[i:i + batch_size], pad)  # (B, V)
        toks, _, _, _ = _decode(model, state, logits, max_new_tokens, temperature, False,
                                generator, eos, pad)  # (B, T)
        rows += [r[:r.index(eos) + 1] if eos in r else r for r in toks.cpu().tolist()]
    return rows, tokenizer.batch_decode(rows, skip_special_tokens=True)


@torch.no_grad()
def generate(model, tokenizer, prompts: list[str], max_new_tokens: int = 16,
             temperature: float = 1.0, greedy: bool = False,
             generator: torch.Generator | None = None) -> Generation:
    """Sample one completion per prompt (repeat prompts for a group): one prefill of the
    left-padded prompts, then one token per step for the whole batch. ``completion_mask`` is 1 up to
    and including the first end-of-sequence token."""
    device = model_device(model)
    prompt_ids, prompt_mask = encode_prompts(tokenizer, prompts, device)
    eos_id, pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    with torch.inference_mode():  # no autograd bookkeeping at all while decoding
        state = _Cache()
        logits = _prefill(model, state, prompt_ids, prompt_mask.clone())
        completion_ids, logps, ents, _ = _decode(model, state, logits, max_new_tokens,
                                                 temperature, greedy, generator, eos_id,
                                                 pad_id)  # (B, T) each
    # clones made outside inference mode are ordinary tensors, usable in the loss's graph
    completion_ids, logps, ents = completion_ids.clone(), logps.clone(), ents.clone()
    mask = completion_mask_from_ids(completion_ids, eos_id)
    texts = tokenizer.batch_decode(completion_ids * mask + pad_id * (1 - mask),
                                   skip_special_tokens=True)
    return Generation(prompt_ids, prompt_mask, completion_ids, mask, logps * mask, ents * mask, texts)


# --- log-probs with gradients: the training forward pass -------------------------------------------
def logps_from_logits(logits: Tensor, ids: Tensor, temperature: float = 1.0) -> tuple[Tensor, Tensor]:
    """log pi(ids) and the entropy at each position from logits (B, T, V) that predict ids (B, T),
    at ``temperature``. Returns (logps, entropies), each (B, T)."""
    logp_all = F.log_softmax(logits.float() / temperature, -1)  # (B, T, V)
    logps = logp_all.gather(-1, ids[..., None]).squeeze(-1)  # (B, T)
    ents = -(logp_all.exp() * logp_all).sum(-1)  # (B, T)
    return logps, ents


def example_logps(model, examples: list[tuple[list[int], list[int]]],
                  pad_id: int) -> tuple[Tensor, Tensor]:
    """Teacher-forced log pi(x_t | x_<t) of (ids, loss mask) examples (``chat_example``) right-padded
    together (``pad_examples``), with gradients, in one forward pass. Returns (logps, mask), each
    (B, L-1): position t scores token t + 1, and mask is that token's loss mask (the sequence
    log-prob of the masked tokens is ``(logps * mask).sum(-1)``)."""
    ids, attn, mask = pad_examples(examples, pad_id, model_device(model))  # (B, L)
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]  # (B, L-1, V)
    logps = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    return logps, mask[:, 1:]  # (B, L-1) each


def join_sequences(prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                   completion_mask: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Prompt + completion as one sequence: (ids, attention mask, positions), each (B, P+T);
    positions count real tokens only, so left padding does not shift them. The logits that predict
    completion token t are at position P - 1 + t."""
    ids = torch.cat([prompt_ids, completion_ids], 1)  # (B, P+T)
    attn = torch.cat([prompt_mask, completion_mask], 1)  # (B, P+T)
    return ids, attn, (attn.cumsum(-1) - 1).clamp(min=0)


def length_buckets(lengths: list[int], overhead: int = 2048) -> list[list[int]]:
    """Rows grouped into micro-batches for a right-padded forward pass: sorted by length (longest
    first), then cut where the total cost sum_k (rows_k x longest_k + ``overhead``) is least
    (dynamic programming over the sorted order). The cost counts padded tokens plus a fixed
    per-call cost in tokens, so a batch of similar lengths stays one call and a batch of very
    different lengths (multi-turn conversations of 1-10 turns) is split.

    >>> length_buckets([10, 900, 12, 880], overhead=100)
    [[1, 3], [2, 0]]
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    n = len(order)
    best, cut = [0.0] + [float("inf")] * n, [0] * (n + 1)  # best[j]: cost of the first j rows
    for j in range(1, n + 1):
        for i in range(j):  # rows i..j-1 in one bucket, padded to the longest, order[i]
            c = best[i] + (j - i) * lengths[order[i]] + overhead
            if c < best[j]:
                best[j], cut[j] = c, i
    out, j = [], n
    while j > 0:
        out.append(order[cut[j]:j])
        j = cut[j]
    return out[::-1]


def _contiguous(prompt_mask: Tensor, completion_mask: Tensor) -> bool:
    """Prompts left-padded and completions right-padded (every record of this module is)."""
    P, T = prompt_mask.shape[1], completion_mask.shape[1]
    p, c = prompt_mask.sum(-1, keepdim=True), completion_mask.sum(-1, keepdim=True)
    ar_p = torch.arange(P, device=p.device)
    ar_t = torch.arange(T, device=c.device)
    return bool(((prompt_mask != 0) == (ar_p >= P - p)).all()
                and ((completion_mask != 0) == (ar_t < c)).all())


def _packs(model) -> bool:
    """Whether ``packed_sequence_logps`` can run the model as decoder + output embedding (logits =
    lm_head(hidden), no soft-capping or logit scale after it)."""
    cfg = getattr(model, "config", None)
    return (hasattr(model, "base_model") and model.base_model is not model
            and getattr(model, "get_output_embeddings", lambda: None)() is not None
            and getattr(cfg, "final_logit_softcapping", None) is None
            and getattr(cfg, "logit_scale", None) is None)


def packed_sequence_logps(model, prompt_ids: Tensor, prompt_mask: Tensor,
                          completion_ids: Tensor, completion_mask: Tensor,
                          temperature: float = 1.0, loss_mask: Tensor | None = None,
                          overhead: int = 2048, value_head=None) -> tuple[Tensor, ...]:
    """``sequence_logps`` without padding inside a sequence and without logits nobody reads: each
    row's real prompt and completion tokens are laid out from position 0 and right-padded within a
    length bucket (``length_buckets``), so causal attention alone (no attention mask) gives every
    real token exactly its unpadded context and positions; the output embedding (lm_head) runs only
    at the positions that predict a token with weight completion_mask x loss_mask != 0. Same
    numbers as the padded pass to rounding (other matmul shapes), same gradients.
    Needs prompts left-padded and completions right-padded (``_contiguous``).

    Returns (logps, entropies), each (B, T), zero where the weight is 0 (times it elsewhere).
    value_head: a module on the decoder's hidden states (a critic sharing the trunk, TRL's
    ``AutoModelForCausalLMWithValueHead``): then (logps, entropies, values), values V(s_t) read at
    the same positions (float32, zero where the weight is 0, unweighted elsewhere).
    """
    B, T = completion_ids.shape
    P = prompt_ids.shape[1]
    w = completion_mask.float() if loss_mask is None else completion_mask.float() * loss_mask
    p_len = prompt_mask.sum(-1).tolist()  # (B,)
    c_len = completion_mask.sum(-1).tolist()
    decoder, head = model.base_model, model.get_output_embeddings()
    rows_b, rows_t, logps, ents, values = [], [], [], [], []
    for bucket in length_buckets([p + c for p, c in zip(p_len, c_len)], overhead):
        L = p_len[bucket[0]] + c_len[bucket[0]]
        # right padding (id 0) comes after every real token: causal attention never reads it
        ids = torch.zeros(len(bucket), L, dtype=torch.long, device=prompt_ids.device)
        for k, b in enumerate(bucket):
            p, c = p_len[b], c_len[b]
            ids[k, :p + c] = torch.cat([prompt_ids[b, P - p:], completion_ids[b, :c]])
        sel = w[bucket].nonzero()  # (K, 2): (row in bucket, t) of the scored tokens
        if sel.shape[0] == 0:
            continue
        r, t = sel[:, 0], sel[:, 1]
        at = torch.tensor([p_len[b] - 1 for b in bucket], device=ids.device)[r] + t  # predicts t
        hidden = decoder(input_ids=ids, use_cache=False).last_hidden_state  # (k, L, H)
        h = hidden[r, at]  # (K, H)
        logp_all = F.log_softmax(head(h).float() / temperature, -1)  # (K, V)
        if value_head is not None:
            values.append(value_head(h.float()).squeeze(-1))  # (K,)
        b_idx = torch.tensor(bucket, device=ids.device)[r]
        tgt = completion_ids[b_idx, t]
        wk = w[b_idx, t]
        logps.append(logp_all.gather(-1, tgt[:, None]).squeeze(-1) * wk)
        ents.append(-(logp_all.exp() * logp_all).sum(-1) * wk)
        rows_b.append(b_idx)
        rows_t.append(t)
    out_lp = torch.zeros(B, T, device=completion_ids.device)
    out_ent = torch.zeros(B, T, device=completion_ids.device)
    out_v = torch.zeros(B, T, device=completion_ids.device)
    if logps:
        idx = (torch.cat(rows_b), torch.cat(rows_t))
        out_lp = out_lp.index_put(idx, torch.cat(logps))
        out_ent = out_ent.index_put(idx, torch.cat(ents))
        if value_head is not None:
            out_v = out_v.index_put(idx, torch.cat(values))
    return (out_lp, out_ent) if value_head is None else (out_lp, out_ent, out_v)


def sequence_logps(model, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                   completion_mask: Tensor, temperature: float = 1.0,
                   loss_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Per-token log-probs and entropies of ``completion_ids`` given the prompts, with gradients.
    ``packed_sequence_logps`` (length buckets, no attention mask, logits only where scored) when
    the record and the model allow it, else one padded forward pass over prompt + completion.

    Returns (logps, entropies), each (B, T), zero where completion_mask (and loss_mask, if given)
    is 0.
    """
    if _packs(model) and _contiguous(prompt_mask, completion_mask):
        return packed_sequence_logps(model, prompt_ids, prompt_mask, completion_ids,
                                     completion_mask, temperature, loss_mask)
    return padded_sequence_logps(model, prompt_ids, prompt_mask, completion_ids, completion_mask,
                                 temperature, loss_mask)


def padded_sequence_logps(model, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                          completion_mask: Tensor, temperature: float = 1.0,
                          loss_mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``sequence_logps`` in one forward pass over the padded prompt + completion (attention mask,
    positions counting real tokens, logits everywhere): the reference the packed pass is tested
    against, and the path for records or models it does not take."""
    ids, attn, pos = join_sequences(prompt_ids, prompt_mask, completion_ids, completion_mask)
    logits = model(input_ids=ids, attention_mask=attn, position_ids=pos).logits  # (B, P+T, V)
    P, T = prompt_ids.shape[1], completion_ids.shape[1]
    logps, ents = logps_from_logits(logits[:, P - 1:P + T - 1], completion_ids, temperature)
    m = completion_mask.to(logps.dtype)
    logps, ents = logps * m, ents * m
    if loss_mask is not None:
        logps, ents = logps * loss_mask, ents * loss_mask
    return logps, ents


def generation_logps(model, g: Generation, temperature: float = 1.0) -> tuple[Tensor, Tensor]:
    """``sequence_logps`` of a ``Generation`` record (zero off its loss mask)."""
    return sequence_logps(model, g.prompt_ids, g.prompt_mask, g.completion_ids, g.completion_mask,
                          temperature, g.loss_mask)


# --- multi-turn episodes --------------------------------------------------------------------------
# One record for every multi-turn policy, from a table to an LM. Index t is the turn. Turn-level
# fields are always filled; the token-level fields only by LM rollouts (``lm_rollout``) and
# ``text_episodes_to_tokens``; positions index ``token_ids``.
@dataclass
class Episode:
    observations: list  # o_t: the text the agent saw before acting at turn t, (T,)
    actions: list  # a_t as text, (T,)
    rewards: list  # r_t, the reward of the step (T,)
    state_keys: list  # hashable true state in which a_t was taken (T,): anchor states, oracles
    valid: list  # whether a_t parsed to a legal action (T,)
    infos: list  # the environment's info dict after each step (T,)
    group_id: int = 0  # episodes of one group start from the same seed/task
    task: object = None  # the task's ground truth (env.task after reset)
    final_observation: str = ""
    next_state_key: object = None  # state key after the last step
    truncated: bool = False  # ended by the turn cap rather than by the task
    context_full: bool = False  # truncated because the next turn could pass lm_rollout's max_context
    action_ids: list | None = None  # index into env.actions, for symbolic policies
    prompt_ids: list | None = None  # the first prompt (system + o_0), not trained on
    token_ids: list | None = None  # agent turns and observations after the first prompt (N,)
    loss_mask: list | None = None  # 1 on agent-generated tokens, 0 on environment tokens (N,)
    logps: list | None = None  # sampling log-prob of each agent token, 0 elsewhere (N,)
    turn_spans: list | None = None  # [start, end) of turn t's action tokens in token_ids (T,)

    def __len__(self) -> int:
        return len(self.actions)

    @classmethod
    def of(cls, state_keys, rewards, group_id: int = 0, **fields) -> "Episode":
        """A hand-made episode for worked examples: one state key and one reward per turn,
        observations 'o', actions 'a', every action valid, unless ``fields`` say otherwise.

        >>> ep = Episode.of(["s", "x"], [0.0, 1.0]); (len(ep), ep.ret, ep.valid)
        (2, 1.0, [True, True])
        """
        n = len(rewards)
        record = dict(observations=["o"] * n, actions=["a"] * n, rewards=list(rewards),
                      state_keys=list(state_keys), valid=[True] * n, infos=[{}] * n,
                      group_id=group_id)
        record.update(fields)
        return cls(**record)

    @classmethod
    def start(cls, env, observation: str, group_id: int = 0, state_key=None,
              tokens: bool = False) -> "Episode":
        """The record of a reset, before any turn: the first observation and state key (the env's
        own unless given) and the task. ``tokens=True``: the LM record ``lm_rollout`` fills (empty
        token fields, no ``action_ids``); else a symbolic policy's (``action_ids=[]``)."""
        ep = cls([observation], [], [], [env.state_key() if state_key is None else state_key], [],
                 [], group_id=group_id, task=getattr(env, "task", None))
        if tokens:
            ep.prompt_ids, ep.token_ids, ep.loss_mask, ep.logps, ep.turn_spans = [], [], [], [], []
        else:
            ep.action_ids = []
        return ep

    @property
    def ret(self) -> float:
        """Undiscounted return sum_t r_t."""
        return float(sum(self.rewards))

    @property
    def success(self) -> bool:
        return bool(self.infos and self.infos[-1].get("success", False))


def episode_stats(episodes, prefix: str = "") -> dict:
    """Success rate, mean return, mean turns and invalid-action rate of a list of episodes."""
    return {f"{prefix}success": float(np.mean([ep.success for ep in episodes])),
            f"{prefix}return": float(np.mean([ep.ret for ep in episodes])),
            f"{prefix}turns": float(np.mean([len(ep) for ep in episodes])),
            f"{prefix}invalid": float(np.mean([1 - np.mean(ep.valid) for ep in episodes]))}


def record_step(ep: Episode, env, a) -> bool:
    """Step ``env`` with action ``a`` (an index into ``env.actions`` or text) and append the turn
    to ``ep`` (a symbolic policy's record: ``action_ids``); False once the episode is done."""
    if isinstance(a, (int, np.integer)):
        ep.action_ids.append(int(a))
        a = env.actions[int(a)]
    else:
        ep.action_ids.append(None)
    obs, r, done, info = env.step(a)
    ep.actions.append(a)
    ep.rewards.append(float(r))
    ep.valid.append(bool(info["valid"]))
    ep.infos.append(info)
    if done:
        ep.final_observation, ep.next_state_key = obs, info["state_key"]
        ep.truncated = bool(info.get("truncated", False))
        return False
    ep.observations.append(obs)
    ep.state_keys.append(info["state_key"])
    return True


def play_episodes(make_env, policy, seeds: list[int], group_size: int = 1,
                  max_turns: int | None = None, prefixes: list | None = None) -> list[Episode]:
    """Play ``len(seeds) * group_size`` episodes with a non-LM policy, all environments stepped
    together. Group i is ``group_size`` episodes reset with ``seeds[i]`` (same task, same start);
    they differ through ``policy`` and, where the environment has ``seed_dynamics``, through
    independent transition noise (member j of seed s always gets the same noise stream).

    make_env: () -> env following the multi-turn protocol (``reset(seed)``, ``step(text)``).
    policy: (envs, observations) -> list of actions for the still-running envs, each either an
        index into ``env.actions`` or free text.
    max_turns: cap on each episode's turns, its replayed prefix included (None: the env's own).
    prefixes: one list of actions per episode (group by group), replayed and recorded after the
        reset before the policy acts (a tree's shared prefix, as TreePS-RAG grows it); an empty
        list starts from the reset. The environment must be deterministic given (seed, actions).
    """
    envs, episodes = [], []
    for gid, seed in enumerate(seeds):
        for member in range(group_size):
            env = make_env()
            obs = env.reset(seed=int(seed))
            if hasattr(env, "seed_dynamics"):  # same task, independent transition noise
                env.seed_dynamics(int(np.random.SeedSequence([int(seed), member]).generate_state(1)[0]))
            envs.append(env)
            episodes.append(Episode.start(env, obs, gid))
    for ep, env, prefix in zip(episodes, envs, prefixes or []):
        for a in prefix:
            if not record_step(ep, env, a):
                raise RuntimeError("a replayed prefix ended before its last action: the "
                                   "environment is not deterministic given (seed, actions)")
    capped = lambda i: max_turns is not None and len(episodes[i]) >= max_turns  # noqa: E731
    running = [i for i in range(len(envs)) if not capped(i)]
    while running:
        acts = policy([envs[i] for i in running], [episodes[i].observations[-1] for i in running])
        running = [i for i, a in zip(running, acts)
                   if record_step(episodes[i], envs[i], a) and not capped(i)]
    # stopped by max_turns here, not by the environment
    return [truncate(ep, len(ep)) if capped(i) and len(ep.observations) > len(ep) else ep
            for i, ep in enumerate(episodes)]


def truncate(episode: Episode, t: int) -> Episode:
    """A copy of ``episode`` cut after its first t turns. Cut before its end, or still running
    (an observation the agent never answered), it ends ``truncated`` at the state and observation
    after turn t (``final_observation``, ``next_state_key``); cut at its end, it is a copy with its
    own flags. The token fields, where there are any, keep the conversation through turn t's
    action tokens (the observation after it is dropped, as ``lm_rollout`` drops it at its cap).

    >>> ep = Episode.of(["s0", "s1", "s2"], [0.0, 0.0, 1.0])
    >>> cut = truncate(ep, 1); (cut.actions, cut.rewards, cut.next_state_key, cut.truncated)
    (['a'], [0.0], 's1', True)
    """
    if not 0 <= t <= len(episode):
        raise ValueError(f"cut after {t} turns outside 0..{len(episode)}")
    ep = replace(episode, observations=list(episode.observations[:t + 1]),
                 actions=list(episode.actions[:t]), rewards=list(episode.rewards[:t]),
                 state_keys=list(episode.state_keys[:t + 1]), valid=list(episode.valid[:t]),
                 infos=list(episode.infos[:t]))
    if episode.action_ids is not None:
        ep.action_ids = list(episode.action_ids[:t])
    if episode.token_ids is not None:
        cut = episode.turn_spans[t - 1][1] if t else 0
        ep.token_ids, ep.loss_mask = list(episode.token_ids[:cut]), list(episode.loss_mask[:cut])
        ep.logps, ep.turn_spans = list(episode.logps[:cut]), list(episode.turn_spans[:t])
    if t < len(episode.observations):  # the observation after turn t was never answered
        ep.next_state_key, ep.final_observation = ep.state_keys.pop(), ep.observations.pop()
        ep.truncated, ep.context_full = True, False
    return ep


def resolve_system_prompt(env, system_prompt):
    """None: the environment's own ``system_prompt`` attribute (none when it has none); "" none."""
    return getattr(env, "system_prompt", None) if system_prompt is None else system_prompt


def _new_episodes(make_env, seeds, group_size):
    envs, episodes = [], []
    for gid, seed in enumerate(seeds):
        for _ in range(group_size):
            env = make_env()
            obs = env.reset(seed=int(seed))
            envs.append(env)
            episodes.append(Episode.start(env, obs, gid, tokens=True))
    return envs, episodes


@torch.inference_mode()
def _play(model, tokenizer, envs, episodes, max_turns, max_new_tokens, temperature, greedy,
          generator, system_prompt, reuse_cache: bool, timers: dict | None = None,
          max_context: int | None = None, desc: str | None = None):
    """Step ``envs`` together (fills ``episodes`` in place). reuse_cache=False re-encodes each
    conversation from its first token every turn (the naive loop). max_context: end (truncated,
    ``context_full``) an episode whose next turn could pass this many tokens; None: no cap.
    desc: show a progress bar over turns under this label (``utils.progress``)."""
    eos_id, pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    timers = timers if timers is not None else {}
    tick = time.perf_counter

    def add(key, t0):
        timers[key] = timers.get(key, 0.0) + tick() - t0

    t0 = tick()
    prompts = tokenizer([prompt_text(tokenizer, ep.observations[0], system_prompt)
                         for ep in episodes], add_special_tokens=False)["input_ids"]
    for ep, ids in zip(episodes, prompts):
        ep.prompt_ids = ids
    pending = [list(ep.prompt_ids) for ep in episodes]  # tokens of each row not yet in the cache
    add("tokenizer", t0)
    running = list(range(len(envs)))
    limit = max_context or 10**12
    record_end = {}
    state = _Cache()
    turn = 0
    bar = progress(total=max_turns, desc=desc, unit="turn") if desc else None
    while running and (max_turns is None or turn < max_turns):
        if bar is not None:
            bar.update(1)
            bar.set_postfix(running=len(running))
        t0 = tick()
        if reuse_cache:
            segments = [pending[i] for i in running]
        else:  # the naive loop: a fresh cache and the whole conversation every turn
            state = _Cache()
            segments = [episodes[i].prompt_ids + episodes[i].token_ids for i in running]
        logits = _feed(model, state, segments, pad_id)
        add("prefill", t0)
        t0 = tick()
        toks, lps, _, unfed = _decode(model, state, logits, max_new_tokens, temperature, greedy,
                                      generator, eos_id, pad_id)
        toks, lps, unfed = toks.cpu(), lps.cpu(), unfed.cpu()  # (B, T), (B, T), (B,)
        add("decode", t0)
        still = []
        # the whole batch at once: one decode call, every env stepped, one encode call
        t0 = tick()
        rows = [row[:row.index(eos_id) + 1] if eos_id in row else row for row in toks.tolist()]
        texts = tokenizer.batch_decode(rows, skip_special_tokens=True)
        add("tokenizer", t0)
        t0 = tick()
        steps = [envs[i].step(text) for i, text in zip(running, texts)]
        add("env", t0)
        t0 = tick()
        live = [k for k, (_, _, done, _) in enumerate(steps) if not done]
        segs = dict(zip(live, tokenizer(
            [observation_text(tokenizer, steps[k][0], system_prompt) for k in live],
            add_special_tokens=False)["input_ids"] if live else []))
        add("tokenizer", t0)
        lps = lps.tolist()
        for k, i in enumerate(running):
            ep, ids, text = episodes[i], rows[k], texts[k]
            obs, r, done, info = steps[k]
            ended = ids[-1] == eos_id
            start = len(ep.token_ids)
            ep.token_ids += ids
            ep.loss_mask += [1] * len(ids)
            ep.logps += lps[k][:len(ids)]
            ep.turn_spans.append((start, len(ep.token_ids)))
            ep.actions.append(text)
            ep.rewards.append(float(r))
            ep.valid.append(bool(info["valid"]))
            ep.infos.append(info)
            carry = [ids[-1]] if bool(unfed[k]) else []  # sampled but not yet in the cache
            if not ended:  # cut by max_new_tokens: close the turn with a template eos (mask 0)
                ep.token_ids.append(eos_id)
                ep.loss_mask.append(0)
                ep.logps.append(0.0)
                carry.append(eos_id)
            seg = segs.get(k, [])
            full = len(ep.prompt_ids) + len(ep.token_ids) + len(seg) + max_new_tokens + 1 > limit
            if done or full:  # full: the next turn could pass max_context tokens
                ep.final_observation, ep.next_state_key = obs, info["state_key"]
                ep.truncated = bool(info.get("truncated", False)) or (full and not done)
                ep.context_full = full and not done
                continue
            ep.observations.append(obs)
            ep.state_keys.append(info["state_key"])
            still.append((k, i))
            record_end[i] = len(ep.token_ids)
            ep.token_ids += seg
            ep.loss_mask += [0] * len(seg)
            ep.logps += [0.0] * len(seg)
            pending[i] = carry + seg
        if reuse_cache and still and len(still) < len(running):
            state.select(torch.tensor([k for k, _ in still], device=state.attn.device))
        if reuse_cache and still:
            state.compact()
        running, turn = [i for _, i in still], turn + 1
    if bar is not None:
        bar.close()
    for i in running:  # stopped by max_turns: drop the observation the agent never answered
        ep = episodes[i]
        ep.next_state_key, ep.final_observation = ep.state_keys.pop(), ep.observations.pop()
        ep.truncated = True
        del ep.token_ids[record_end[i]:], ep.loss_mask[record_end[i]:], ep.logps[record_end[i]:]
    return episodes


def lm_rollout(model, tokenizer, make_env, seeds: list[int], group_size: int = 1,
               max_turns: int | None = None, max_new_tokens: int = 8, temperature: float = 1.0,
               generator: torch.Generator | None = None, system_prompt: str | None = None,
               greedy: bool = False, timers: dict | None = None,
               max_context: int | None = None, desc: str | None = None) -> list[Episode]:
    """Play ``len(seeds) * group_size`` episodes with the LM, every running environment stepped
    together, one batched generation per turn on a KV cache kept across turns. Group i is
    ``group_size`` episodes reset with ``seeds[i]``. Returns token-level ``Episode`` records.

    system_prompt: None uses the environment's ``system_prompt`` attribute, "" none.
    timers: optional dict that accumulates seconds per phase (prefill, decode, env, tokenizer).
    max_context: end an episode (truncated, ``context_full``) when the next observation plus a
    full action could pass this many tokens, e.g. the positions the model was trained on (the tiny
    LM's 512: its rotary positions run past them without an error, into untrained territory);
    None: no cap. desc: show a progress bar over turns (e.g. 'eval panel').
    """
    model.eval()
    envs, episodes = _new_episodes(make_env, seeds, group_size)
    return _play(model, tokenizer, envs, episodes, max_turns, max_new_tokens, temperature, greedy,
                 generator, resolve_system_prompt(envs[0], system_prompt), reuse_cache=True, timers=timers,
                 max_context=max_context, desc=desc)


def naive_rollout(model, tokenizer, make_env, seeds: list[int], group_size: int = 1,
                  max_turns: int | None = None, max_new_tokens: int = 8, temperature: float = 1.0,
                  generator: torch.Generator | None = None, system_prompt: str | None = None,
                  greedy: bool = False, timers: dict | None = None) -> list[Episode]:
    """The same episodes one at a time, re-encoding the whole conversation each turn (the KV cache
    only within a turn's generation). Same records as ``lm_rollout``; for the benchmark."""
    model.eval()
    out = []
    for gid, seed in enumerate(seeds):
        for _ in range(group_size):
            envs, eps = _new_episodes(make_env, [seed], 1)
            eps[0].group_id = gid
            out += _play(model, tokenizer, envs, eps, max_turns, max_new_tokens, temperature,
                         greedy, generator, resolve_system_prompt(envs[0], system_prompt),
                         reuse_cache=False, timers=timers)
    return out


def replay(make_env, episode, t: int, seed: int):
    """(env, observation, done): a fresh environment reset with ``seed`` and stepped through the
    first t actions of ``episode`` (an ``Episode``, whose action texts are replayed, or a list of
    actions, each an index into ``env.actions`` or text). Every environment of the library is
    deterministic given its seed and actions, so a state is restored by replay and never copied.
    observation: the one the agent sees after the t actions; done: whether the last ended it."""
    actions = episode.actions if isinstance(episode, Episode) else episode
    if not 0 <= t <= len(actions):
        raise ValueError(f"replay of {t} actions outside 0..{len(actions)}")
    env = make_env()
    obs, done = env.reset(seed=int(seed)), False
    for k, a in enumerate(actions[:t]):
        if done:
            raise ValueError(f"prefix action {k} comes after the episode ended")
        obs, _, done, _ = env.step(env.actions[int(a)] if isinstance(a, (int, np.integer)) else a)
    return env, obs, done


def fork_episode(make_env, parent: Episode, t: int, seed: int, group_id: int | None = None):
    """(env, episode): ``parent`` cut before its turn t, and a fresh environment restored to that
    state (``replay``). The token fields are cut at turn t's first action token when the parent
    has them. For tree and sibling rollouts (TreePS-RAG, SLATE, ARPO): continue the fork with
    ``lm_continue`` or any ``play_episodes`` policy."""
    if not 0 <= t < len(parent):
        raise ValueError(f"fork turn {t} outside the parent's turns 0..{len(parent) - 1}")
    env, _, _ = replay(make_env, parent, t, seed)
    ep = Episode(list(parent.observations[:t + 1]), list(parent.actions[:t]),
                 list(parent.rewards[:t]), list(parent.state_keys[:t + 1]), list(parent.valid[:t]),
                 list(parent.infos[:t]), group_id=parent.group_id if group_id is None else group_id,
                 task=getattr(env, "task", None))
    if parent.action_ids is not None:
        ep.action_ids = list(parent.action_ids[:t])
    if parent.token_ids is not None:
        cut = parent.turn_spans[t][0]
        ep.prompt_ids, ep.token_ids = list(parent.prompt_ids), list(parent.token_ids[:cut])
        ep.loss_mask, ep.logps = list(parent.loss_mask[:cut]), list(parent.logps[:cut])
        ep.turn_spans = list(parent.turn_spans[:t])
    return env, ep


def lm_continue(model, tokenizer, envs, episodes, max_turns: int | None, max_new_tokens: int = 8,
                temperature: float = 1.0, generator: torch.Generator | None = None,
                system_prompt: str | None = None, greedy: bool = False,
                max_context: int | None = None) -> list[Episode]:
    """Continue token-level episodes (forks from ``fork_episode``: each with its restored env) with
    the LM for up to ``max_turns`` more turns, all stepped together, each conversation re-encoded
    from its first token every turn (the forks share no cache). Fills ``episodes`` in place and
    returns them; the records are ``lm_rollout``'s."""
    if max_turns is not None and max_turns < 1:
        raise ValueError(f"max_turns must be >= 1 (or None), got {max_turns}")
    model.eval()
    return _play(model, tokenizer, envs, episodes, max_turns, max_new_tokens, temperature, greedy,
                 generator, resolve_system_prompt(envs[0], system_prompt), reuse_cache=False,
                 max_context=max_context)


def text_episodes_to_tokens(tokenizer, episodes, system_prompt: str | None = None):
    """Fill the token-level fields of episodes played by a non-LM policy (text actions), exactly
    as ``lm_rollout`` would have recorded them had the model generated those actions: for SFT on
    scripted trajectories. logps are left at 0. system_prompt: "" or None for none."""
    eos_id = tokenizer.eos_token_id
    for ep in episodes:
        ep.prompt_ids = token_ids(tokenizer, prompt_text(tokenizer, ep.observations[0], system_prompt))
        ep.token_ids, ep.loss_mask, ep.turn_spans = [], [], []
        for t, a in enumerate(ep.actions):
            if t > 0:
                seg = token_ids(tokenizer, observation_text(tokenizer, ep.observations[t], system_prompt))
                ep.token_ids += seg
                ep.loss_mask += [0] * len(seg)
            ids = token_ids(tokenizer, a) + [eos_id]
            ep.turn_spans.append((len(ep.token_ids), len(ep.token_ids) + len(ids)))
            ep.token_ids += ids
            ep.loss_mask += [1] * len(ids)
        ep.logps = [0.0] * len(ep.token_ids)
    return episodes


def prefix_record(tokenizer, env, observations: list[str], actions: list[str], observation: str,
                  system_prompt: str | None = None, group_id: int = 0) -> Episode:
    """The record ``lm_continue`` plays the next turn of, from a replayed conversation: the first
    observation as the prompt, then ``actions`` and ``observations[1:]`` with the current
    ``observation`` after them, as context (loss mask 0, no turn spans: nothing in it is trained).
    ``env`` is at that state (``replay``). SLATE's shared prefix: one sibling turn per record."""
    head = Episode(list(observations), list(actions), [0.0] * len(actions), [None] * len(actions),
                   [True] * len(actions), [{}] * len(actions))
    text_episodes_to_tokens(tokenizer, [head], system_prompt)
    if actions:
        seg = token_ids(tokenizer, observation_text(tokenizer, observation, system_prompt))
        head.token_ids += seg
    record = Episode.start(env, observations[0], group_id, tokens=True)
    record.prompt_ids, record.token_ids = head.prompt_ids, head.token_ids
    record.loss_mask, record.logps = [0] * len(head.token_ids), [0.0] * len(head.token_ids)
    return record


def pad_episodes(episodes, pad_id: int, device) -> Generation:
    """Token-level episodes as one ``Generation``: the first prompts left-padded (B, P); the rest of
    each conversation right-padded (B, N) with ``completion_mask`` 1 on its real tokens and
    ``loss_mask`` 1 on the agent's; the sampling ``logps`` (0 elsewhere). Built on the host, then
    copied to ``device`` (the model's)."""
    B = len(episodes)
    P = max(len(ep.prompt_ids) for ep in episodes)
    N = max(max(len(ep.token_ids) for ep in episodes), 1)
    host = dict(device="cpu")
    prompt_ids = torch.full((B, P), pad_id, dtype=torch.long, **host)
    prompt_mask = torch.zeros(B, P, dtype=torch.long, **host)
    ids = torch.full((B, N), pad_id, dtype=torch.long, **host)
    attn = torch.zeros(B, N, dtype=torch.long, **host)
    loss_mask = torch.zeros(B, N, **host)
    logps = torch.zeros(B, N, **host)
    for i, ep in enumerate(episodes):
        p, n = len(ep.prompt_ids), len(ep.token_ids)
        prompt_ids[i, P - p:] = torch.tensor(ep.prompt_ids, dtype=torch.long, **host)
        prompt_mask[i, P - p:] = 1
        if n:
            ids[i, :n] = torch.tensor(ep.token_ids, dtype=torch.long, **host)
            attn[i, :n] = 1
            loss_mask[i, :n] = torch.tensor(ep.loss_mask, dtype=torch.float, **host)
            logps[i, :n] = torch.tensor(ep.logps, dtype=torch.float, **host)
    to = lambda x: x.to(device)  # noqa: E731
    return Generation(to(prompt_ids), to(prompt_mask), to(ids), to(attn), to(logps),
                      loss_mask=to(loss_mask))


def episode_logps(model, episodes, temperature: float = 1.0, pad_id: int | None = None):
    """log pi_theta(token_n | everything before it) for every token of each conversation, with
    gradients, in one forward pass; zero off the loss mask.

    Returns (logps, entropies, loss_mask), each (B, N) aligned with ``token_ids`` (right-padded).
    """
    device = model_device(model)
    if pad_id is None:
        pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    g = pad_episodes(episodes, pad_id, device)
    logps, ents = generation_logps(model, g, temperature)
    return logps, ents, g.loss_mask
