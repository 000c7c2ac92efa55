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

import numpy as np
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
        # stays reproducible); the CPU path below is the common one
        tok = torch.multinomial(probs.to(generator.device), 1, generator=generator)
        return tok.squeeze(-1).to(logits.device), logp_all
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1), logp_all


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
        tok, logp_all = sample_next(logits, temperature, greedy, generator)  # (B,), (B, V)
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


# --- multi-turn episodes --------------------------------------------------------------------------
# One record for every multi-turn policy, from a table to an LM. Index t is the turn. Turn-level
# fields are always filled; the token-level fields only by LM rollouts (``lm_rollout``), where the
# whole conversation after the first prompt is one token sequence and ``loss_mask`` is 1 exactly on
# the tokens the agent generated (never on environment observations or chat-template tokens).


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
    action_ids: list | None = None  # index into env.actions, for symbolic policies
    # token level (LM rollouts); positions index ``token_ids``
    prompt_ids: list | None = None  # the first prompt (system + o_0), not trained on
    token_ids: list | None = None  # agent turns and observations after the first prompt (N,)
    loss_mask: list | None = None  # 1 on agent-generated tokens, 0 on environment tokens (N,)
    logps: list | None = None  # sampling log-prob of each agent token, 0 elsewhere (N,)
    turn_spans: list | None = None  # [start, end) of turn t's action tokens in token_ids (T,)

    def __len__(self) -> int:
        return len(self.actions)

    @property
    def ret(self) -> float:
        """Undiscounted return sum_t r_t."""
        return float(sum(self.rewards))

    @property
    def success(self) -> bool:
        return bool(self.infos and self.infos[-1].get("success", False))


def play_episodes(make_env, policy, seeds: list[int], group_size: int = 1,
                  max_turns: int | None = None) -> list[Episode]:
    """Play ``len(seeds) * group_size`` episodes with a non-LM policy, all environments stepped
    together. Group i is ``group_size`` episodes reset with ``seeds[i]`` (same task, same start);
    they differ through ``policy`` and, where the environment has ``seed_dynamics``, through
    independent transition noise (member j of seed s always gets the same noise stream).

    make_env: () -> env following the multi-turn protocol (``reset(seed)``, ``step(text)``).
    policy: (envs, observations) -> list of actions for the still-running envs, each either an
        index into ``env.actions`` or free text.
    """
    envs, episodes = [], []
    for gid, seed in enumerate(seeds):
        for member in range(group_size):
            env = make_env()
            obs = env.reset(seed=int(seed))
            if hasattr(env, "seed_dynamics"):  # same task, independent transition noise
                env.seed_dynamics(int(np.random.SeedSequence([int(seed), member]).generate_state(1)[0]))
            envs.append(env)
            episodes.append(Episode([obs], [], [], [env.state_key()], [], [], group_id=gid,
                                    task=getattr(env, "task", None), action_ids=[]))
    running = list(range(len(envs)))
    turn = 0
    while running and (max_turns is None or turn < max_turns):
        acts = policy([envs[i] for i in running], [episodes[i].observations[-1] for i in running])
        still = []
        for i, a in zip(running, acts):
            ep, env = episodes[i], envs[i]
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
            else:
                ep.observations.append(obs)
                ep.state_keys.append(info["state_key"])
                still.append(i)
        running, turn = still, turn + 1
    for i in running:  # stopped by max_turns here, not by the environment
        ep = episodes[i]
        ep.next_state_key, ep.final_observation = ep.state_keys.pop(), ep.observations.pop()
        ep.truncated = True
    return episodes


def tabular_agent(probs, index, generator: np.random.Generator | None = None):
    """A policy for ``play_episodes`` from a table: ``probs[index(env)]`` is the action
    distribution (over ``env.actions``) in env's current state.

    probs: (S, A) array or tensor; index: env -> row (e.g. ``lambda e: e.state_index()``).
    """
    rng = generator if generator is not None else np.random.default_rng()
    table = np.asarray(probs.detach().cpu() if hasattr(probs, "detach") else probs, dtype=float)

    def act(envs, observations):
        return [int(rng.choice(table.shape[1], p=table[index(e)])) for e in envs]
    return act
