"""Language models as multi-turn agents: batched rollouts with a persistent KV cache, the token
record of a conversation, per-token log-probs for training, multi-turn GRPO/GiGPO, and a short SFT
warm-start on a scripted policy.

**The token record.** A conversation is rendered with the tokenizer's chat template (ChatML for the
tiny LM) and kept as token ids, never re-tokenised::

    prompt_ids : <|im_start|>system\\n{system}<|im_end|>\\n<|im_start|>user\\n{o_0}<|im_end|>\\n<|im_start|>assistant\\n
    token_ids  : {a_0}<|im_end|> \\n<|im_start|>user\\n{o_1}<|im_end|>\\n<|im_start|>assistant\\n {a_1}<|im_end|> ...
    loss_mask  :  1 1 1 ...  1     0 0 0 ...                                        0   1 1 ...   1

``loss_mask`` is 1 exactly on the tokens the model sampled (each action and its end-of-turn token),
0 on observations and template tokens; ``turn_spans[t]`` is the [start, end) of action t in
``token_ids`` (the mask-1 tokens of turn t). An action cut by ``max_new_tokens`` gets an
end-of-turn token appended as a template token (mask 0), so the conversation stays well-formed.
The environment's final observation is never seen by the agent and is not in ``token_ids``.

**Batched rollout (``lm_rollout``).** All running environments are stepped together. The KV cache
is kept across turns: each turn feeds only the new tokens (the previous action's unfed last token
and the observation segment) of every running conversation, left-padded to a common length with
attention mask 0 on the padding, then decodes the actions one token per step for the whole batch.
Padding therefore sits *inside* the cached sequence (mask 0, never attended); positions count real
tokens only, so each row sees exactly the positions and attention of its own unpadded conversation.
Finished conversations leave the batch (their rows are dropped from the cache).
``naive_rollout`` plays the same episodes one at a time and re-encodes the whole conversation each
turn: the loop one would write first, kept for the benchmark and as a reference in the tests.

**Training.** ``episode_token_logps`` recomputes log pi(token) for a batch of episodes in one
forward pass (prompts left-padded, conversations right-padded) with gradients; the update is
``grpo.policy_loss`` on (B, N) tensors with per-token advantages spread over each turn's action
(``credit.to_token_advantages``) and the loss mask. ``train_agent`` is the loop.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from agentrl_lib.rollout import Episode, sample_next

Tensor = torch.Tensor
SYSTEM_PROMPT = "Reach the goal. Answer with one move."
ESTIMATORS = ("grpo", "gigpo")


# --- the chat template as token segments ---------------------------------------------------------
def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def prompt_text(tokenizer, observation: str, system_prompt: str | None = SYSTEM_PROMPT) -> str:
    """The first prompt: system message (if any) + the first observation + the generation prompt."""
    msgs = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + \
        [{"role": "user", "content": observation}]
    return tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)


def observation_text(tokenizer, observation: str, system_prompt: str | None = SYSTEM_PROMPT) -> str:
    """The template text between an assistant's end-of-turn token and the next generation: for
    ChatML ``"\\n<|im_start|>user\\n{obs}<|im_end|>\\n<|im_start|>assistant\\n"``. Derived from the
    template itself (rendered with and without the new user turn), so other templates work as long
    as they render a conversation as a prefix of its continuation."""
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


# --- one turn of batched decoding on a persistent cache ------------------------------------------
@dataclass
class _Batch:
    """The running conversations' KV cache. attn: (B, L) 1 on real tokens (padding sits inside
    the sequence with 0); next_pos: (B,) position of each row's next real token."""
    cache: object = None
    attn: Tensor | None = None
    next_pos: Tensor | None = None

    def select(self, idx: Tensor) -> None:
        if self.cache is not None:
            self.cache.batch_select_indices(idx)
            self.attn, self.next_pos = self.attn[idx], self.next_pos[idx]


def _feed(model, state: _Batch, segments: list[list[int]], pad_id: int) -> Tensor:
    """Append each row's segment (left-padded to a common length) to the cache; returns the
    next-token logits (B, V) after each row's last segment token."""
    device = next(model.parameters()).device
    S = max(len(s) for s in segments)
    ids = torch.full((len(segments), S), pad_id, dtype=torch.long)
    seg_mask = torch.zeros(len(segments), S, dtype=torch.long)
    for i, s in enumerate(segments):
        ids[i, S - len(s):] = torch.tensor(s, dtype=torch.long)
        seg_mask[i, S - len(s):] = 1
    ids, seg_mask = ids.to(device), seg_mask.to(device)
    if state.cache is None:
        state.attn = seg_mask
        state.next_pos = torch.zeros(len(segments), dtype=torch.long, device=device)
    else:
        state.attn = torch.cat([state.attn, seg_mask], 1)
    pos = (state.next_pos[:, None] + seg_mask.cumsum(-1) - 1).clamp(min=0)  # (B, S) real tokens only
    out = model(input_ids=ids, attention_mask=state.attn, position_ids=pos,
                past_key_values=state.cache, use_cache=True)
    state.cache = out.past_key_values
    state.next_pos = state.next_pos + seg_mask.sum(-1)
    return out.logits[:, -1]


def _decode(model, state: _Batch, logits: Tensor, max_new_tokens: int, temperature: float,
            greedy: bool, generator, eos_id: int, pad_id: int):
    """Sample one action per row, one token per step for the whole batch, on the cache.

    Returns per row (token ids incl. the first eos, their log-probs, ended-with-eos, last token
    unfed): a row's last sampled token is not yet in the cache when decoding stopped right after it.
    """
    B = logits.shape[0]
    device = logits.device
    done = torch.zeros(B, dtype=torch.bool, device=device)
    toks, lps = [], []
    unfed = torch.zeros(B, dtype=torch.bool, device=device)
    for step in range(max_new_tokens):
        tok, logp_all = sample_next(logits, temperature, greedy, generator)  # (B,), (B, V)
        live = ~done  # rows whose token this step is real
        tok = torch.where(live, tok, torch.full_like(tok, pad_id))
        toks.append(tok)
        lps.append(logp_all.gather(-1, tok[:, None]).squeeze(-1))
        done = done | (tok == eos_id)
        if done.all() or step == max_new_tokens - 1:
            unfed = live
            break
        # finished rows feed a pad with attention 0: the cache grows in lock-step, they see nothing
        state.attn = torch.cat([state.attn, live.long()[:, None]], 1)
        out = model(input_ids=tok[:, None], attention_mask=state.attn,
                    position_ids=state.next_pos[:, None], past_key_values=state.cache, use_cache=True)
        state.cache, logits = out.past_key_values, out.logits[:, -1]
        state.next_pos = state.next_pos + live.long()
    toks_t, lps_t = torch.stack(toks, 1).cpu(), torch.stack(lps, 1).cpu()  # (B, T)
    rows = []
    for i in range(B):
        ids = toks_t[i].tolist()
        n = ids.index(eos_id) + 1 if eos_id in ids else len(ids)
        rows.append((ids[:n], lps_t[i, :n].tolist(), eos_id in ids[:n], bool(unfed[i])))
    return rows


# --- rollouts ------------------------------------------------------------------------------------
def _new_episodes(make_env, seeds, group_size):
    envs, episodes = [], []
    for gid, seed in enumerate(seeds):
        for _ in range(group_size):
            env = make_env()
            obs = env.reset(seed=int(seed))
            envs.append(env)
            episodes.append(Episode([obs], [], [], [env.state_key()], [], [], group_id=gid,
                                    task=getattr(env, "task", None), prompt_ids=[], token_ids=[],
                                    loss_mask=[], logps=[], turn_spans=[]))
    return envs, episodes


@torch.no_grad()
def _play(model, tokenizer, envs, episodes, max_turns, max_new_tokens, temperature, greedy,
          generator, system_prompt, reuse_cache: bool, timers: dict | None = None):
    """Step ``envs`` together (fills ``episodes`` in place). reuse_cache=False re-encodes each
    conversation from its first token every turn (the naive loop)."""
    eos_id, pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    timers = timers if timers is not None else {}
    tick = time.perf_counter

    def add(key, t0):
        timers[key] = timers.get(key, 0.0) + tick() - t0

    t0 = tick()
    for ep in episodes:
        ep.prompt_ids = _ids(tokenizer, prompt_text(tokenizer, ep.observations[0], system_prompt))
    pending = [list(ep.prompt_ids) for ep in episodes]  # tokens of each row not yet in the cache
    add("tokenizer", t0)
    running = list(range(len(envs)))
    record_end = {}
    state = _Batch()
    turn = 0
    while running and (max_turns is None or turn < max_turns):
        t0 = tick()
        if reuse_cache:
            segments = [pending[i] for i in running]
        else:  # the naive loop: a fresh cache and the whole conversation every turn
            state = _Batch()
            segments = [episodes[i].prompt_ids + episodes[i].token_ids for i in running]
        logits = _feed(model, state, segments, pad_id)
        add("prefill", t0)
        t0 = tick()
        rows = _decode(model, state, logits, max_new_tokens, temperature, greedy, generator,
                       eos_id, pad_id)
        add("decode", t0)
        still = []
        for k, (i, (ids, lps, ended, unfed)) in enumerate(zip(running, rows)):
            ep, env = episodes[i], envs[i]
            t0 = tick()
            start = len(ep.token_ids)
            ep.token_ids += ids
            ep.loss_mask += [1] * len(ids)
            ep.logps += lps
            ep.turn_spans.append((start, len(ep.token_ids)))
            text = tokenizer.decode(ids, skip_special_tokens=True)
            add("tokenizer", t0)
            t0 = tick()
            obs, r, done, info = env.step(text)
            add("env", t0)
            ep.actions.append(text)
            ep.rewards.append(float(r))
            ep.valid.append(bool(info["valid"]))
            ep.infos.append(info)
            carry = [ids[-1]] if unfed else []  # sampled but not yet in the cache
            if not ended:  # cut by max_new_tokens: close the turn with a template eos (mask 0)
                ep.token_ids.append(eos_id)
                ep.loss_mask.append(0)
                ep.logps.append(0.0)
                carry.append(eos_id)
            if done:
                ep.final_observation, ep.next_state_key = obs, info["state_key"]
                ep.truncated = bool(info.get("truncated", False))
                continue
            ep.observations.append(obs)
            ep.state_keys.append(info["state_key"])
            still.append((k, i))
            t0 = tick()
            seg = _ids(tokenizer, observation_text(tokenizer, obs, system_prompt))
            add("tokenizer", t0)
            record_end[i] = len(ep.token_ids)
            ep.token_ids += seg
            ep.loss_mask += [0] * len(seg)
            ep.logps += [0.0] * len(seg)
            pending[i] = carry + seg
        if reuse_cache and still and len(still) < len(running):
            state.select(torch.tensor([k for k, _ in still], device=state.attn.device))
        running, turn = [i for _, i in still], turn + 1
    for i in running:  # stopped by max_turns: drop the observation the agent never answered
        ep = episodes[i]
        ep.next_state_key, ep.final_observation = ep.state_keys.pop(), ep.observations.pop()
        ep.truncated = True
        del ep.token_ids[record_end[i]:], ep.loss_mask[record_end[i]:], ep.logps[record_end[i]:]
    return episodes


def lm_rollout(model, tokenizer, make_env, seeds: list[int], group_size: int = 1,
               max_turns: int | None = None, max_new_tokens: int = 8, temperature: float = 1.0,
               generator: torch.Generator | None = None, system_prompt: str | None = SYSTEM_PROMPT,
               greedy: bool = False, timers: dict | None = None) -> list[Episode]:
    """Play ``len(seeds) * group_size`` episodes with the LM, every running environment stepped
    together, one batched generation per turn on a KV cache kept across turns. Group i is
    ``group_size`` episodes reset with ``seeds[i]``. Returns token-level ``Episode`` records.

    timers: optional dict that accumulates seconds per phase (prefill, decode, env, tokenizer).
    """
    model.eval()
    envs, episodes = _new_episodes(make_env, seeds, group_size)
    return _play(model, tokenizer, envs, episodes, max_turns, max_new_tokens, temperature, greedy,
                 generator, system_prompt, reuse_cache=True, timers=timers)


def naive_rollout(model, tokenizer, make_env, seeds: list[int], group_size: int = 1,
                  max_turns: int | None = None, max_new_tokens: int = 8, temperature: float = 1.0,
                  generator: torch.Generator | None = None,
                  system_prompt: str | None = SYSTEM_PROMPT, greedy: bool = False,
                  timers: dict | None = None) -> list[Episode]:
    """The same episodes one at a time, re-encoding the whole conversation each turn (the KV cache
    only within a turn's generation). Same records as ``lm_rollout``; for the benchmark."""
    model.eval()
    out = []
    for gid, seed in enumerate(seeds):
        for _ in range(group_size):
            envs, eps = _new_episodes(make_env, [seed], 1)
            eps[0].group_id = gid
            out += _play(model, tokenizer, envs, eps, max_turns, max_new_tokens, temperature,
                         greedy, generator, system_prompt, reuse_cache=False, timers=timers)
    return out


def text_episodes_to_tokens(tokenizer, episodes, system_prompt: str | None = SYSTEM_PROMPT):
    """Fill the token-level fields of episodes played by a non-LM policy (text actions), exactly
    as ``lm_rollout`` would have recorded them had the model generated those actions: for SFT on
    scripted trajectories. logps are left at 0."""
    eos_id = tokenizer.eos_token_id
    for ep in episodes:
        ep.prompt_ids = _ids(tokenizer, prompt_text(tokenizer, ep.observations[0], system_prompt))
        ep.token_ids, ep.loss_mask, ep.turn_spans = [], [], []
        for t, a in enumerate(ep.actions):
            if t > 0:
                seg = _ids(tokenizer, observation_text(tokenizer, ep.observations[t], system_prompt))
                ep.token_ids += seg
                ep.loss_mask += [0] * len(seg)
            ids = _ids(tokenizer, a) + [eos_id]
            ep.turn_spans.append((len(ep.token_ids), len(ep.token_ids) + len(ids)))
            ep.token_ids += ids
            ep.loss_mask += [1] * len(ids)
        ep.logps = [0.0] * len(ep.token_ids)
    return episodes


# --- per-token log-probs for training -------------------------------------------------------------
def pad_episodes(episodes, pad_id: int, device="cpu"):
    """(prompt_ids, prompt_mask) left-padded (B, P); (token_ids, attn, loss_mask, logps)
    right-padded (B, N). attn is 1 on every real token of the conversation, loss_mask on agent ones."""
    B = len(episodes)
    P = max(len(ep.prompt_ids) for ep in episodes)
    N = max(max(len(ep.token_ids) for ep in episodes), 1)
    prompt_ids = torch.full((B, P), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros(B, P, dtype=torch.long)
    token_ids = torch.full((B, N), pad_id, dtype=torch.long)
    attn = torch.zeros(B, N, dtype=torch.long)
    loss_mask = torch.zeros(B, N)
    logps = torch.zeros(B, N)
    for i, ep in enumerate(episodes):
        p, n = len(ep.prompt_ids), len(ep.token_ids)
        prompt_ids[i, P - p:], prompt_mask[i, P - p:] = torch.tensor(ep.prompt_ids), 1
        if n:
            token_ids[i, :n], attn[i, :n] = torch.tensor(ep.token_ids), 1
            loss_mask[i, :n] = torch.tensor(ep.loss_mask, dtype=torch.float)
            logps[i, :n] = torch.tensor(ep.logps, dtype=torch.float)
    to = lambda x: x.to(device)  # noqa: E731
    return tuple(map(to, (prompt_ids, prompt_mask, token_ids, attn, loss_mask, logps)))


def episode_token_logps(model, episodes, temperature: float = 1.0, pad_id: int | None = None):
    """log pi_theta(token_n | everything before it) for every token of each conversation, with
    gradients, in one forward pass; zero where loss_mask is 0.

    Returns (logps, entropies, loss_mask), each (B, N) aligned with ``token_ids`` (right-padded).
    """
    from agentrl_lib.rollout import sequence_logps

    device = next(model.parameters()).device
    if pad_id is None:
        pad_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    prompt_ids, prompt_mask, token_ids, attn, loss_mask, _ = pad_episodes(episodes, pad_id, device)
    logps, ents = sequence_logps(model, prompt_ids, prompt_mask, token_ids, attn, temperature)
    return logps * loss_mask, ents * loss_mask, loss_mask  # (B, N) each


# --- multi-turn GRPO / GiGPO ---------------------------------------------------------------------
@dataclass
class AgentLMConfig:
    estimator: str = "grpo"
    """turn advantages: 'grpo' (episode return normalised in its group, broadcast to every turn)
    or 'gigpo' (plus omega x the anchor-state step advantage; credit.gigpo_advantages)"""
    num_iters: int = 20
    """updates (one rollout round each)"""
    num_tasks: int = 8
    """groups per update: task seeds drawn from the training seeds"""
    group_size: int = 8
    """episodes per task (G)"""
    max_turns: int = 6
    """turn cap of an episode (the env's own cap applies too)"""
    max_new_tokens: int = 6
    """token budget of one action (incl. the end-of-turn token)"""
    temperature: float = 1.0
    lr: float = 3e-4
    """AdamW learning rate, constant"""
    num_inner_epochs: int = 1
    """optimizer steps per rollout round"""
    clip_eps: float = 0.2
    """PPO clip range of grpo.policy_loss"""
    loss_agg: str = "token_mean"
    """grpo.policy_loss aggregation over agent tokens: 'token_mean' (verl-agent's default) or
    'seq_mean' (mean over each episode's agent tokens, then over episodes)"""
    gamma: float = 0.95
    """discount of GiGPO's step-level returns (the paper's 0.95)"""
    omega: float = 1.0
    """weight of GiGPO's step advantage (the paper's 1)"""
    max_grad_norm: float = 1.0
    eval_every: int = 5
    """updates between evaluations on the fixed panel"""
    seed: int = 0

    def __post_init__(self):
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"unknown estimator {self.estimator!r}; choose one of {ESTIMATORS}")


def turn_advantages(episodes, cfg: AgentLMConfig) -> list[np.ndarray]:
    """One advantage per turn of each episode, by ``cfg.estimator``."""
    from agentrl_lib.algorithms import credit

    if cfg.estimator == "grpo":
        return credit.grpo_broadcast(episodes)
    return credit.gigpo_advantages(episodes, gamma=cfg.gamma, omega=cfg.omega)


def agent_loss(model, episodes, token_adv: Tensor, cfg: AgentLMConfig):
    """grpo.policy_loss on the episodes' agent tokens; token_adv (B, N) aligned with token_ids."""
    from agentrl_lib.algorithms.grpo import GRPOConfig, policy_loss

    logps, ents, mask = episode_token_logps(model, episodes, cfg.temperature)
    device = logps.device
    _, _, _, _, _, old = pad_episodes(episodes, 0, device)
    gcfg = GRPOConfig(clip_eps=cfg.clip_eps, loss_agg=cfg.loss_agg, beta=0.0)
    loss, m = policy_loss(logps, old, token_adv.to(device), mask, gcfg)
    m["entropy"] = float((ents.detach() * mask).sum() / mask.sum().clamp(min=1))
    return loss, m


@torch.no_grad()
def evaluate_panel(model, tokenizer, make_env, seeds: list[int], max_turns: int,
                   max_new_tokens: int, samples: int = 1, temperature: float = 1.0,
                   generator: torch.Generator | None = None,
                   system_prompt: str | None = SYSTEM_PROMPT) -> dict:
    """Success rate, mean return, turns and invalid-action rate on a fixed panel of task seeds.
    samples=0: greedy, one episode per seed; else ``samples`` sampled episodes per seed."""
    eps = lm_rollout(model, tokenizer, make_env, seeds, max(samples, 1), max_turns,
                     max_new_tokens, temperature, generator, system_prompt, greedy=samples == 0)
    return {"success": float(np.mean([ep.success for ep in eps])),
            "return": float(np.mean([ep.ret for ep in eps])),
            "turns": float(np.mean([len(ep) for ep in eps])),
            "invalid": float(np.mean([1 - np.mean(ep.valid) for ep in eps]))}


def train_agent(model, tokenizer, make_env, cfg: AgentLMConfig, train_seeds: list[int],
                eval_seeds: list[int] | None = None, eval_samples: int = 4, logger=None,
                on_step=None, system_prompt: str | None = SYSTEM_PROMPT) -> list[dict]:
    """Multi-turn GRPO: each update draws ``num_tasks`` task seeds, plays ``group_size`` episodes
    of each with ``lm_rollout``, turns returns into per-turn advantages (``cfg.estimator``),
    spreads them over each turn's action tokens, and takes ``num_inner_epochs`` steps of the
    clipped loss. Evaluates on ``eval_seeds`` every ``eval_every`` updates and at the end (the
    evaluation draws use their own fixed generator, so every evaluation sees the same randomness).
    Returns the logged rows."""
    import random

    from agentrl_lib.algorithms import credit

    rng = random.Random(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    rows = []
    for it in range(cfg.num_iters + 1):
        row = {"step": it}
        if eval_seeds is not None and (it % cfg.eval_every == 0 or it == cfg.num_iters):
            t0 = time.perf_counter()
            ev = evaluate_panel(model, tokenizer, make_env, eval_seeds, cfg.max_turns,
                                cfg.max_new_tokens, eval_samples, cfg.temperature,
                                torch.Generator().manual_seed(10_000 + cfg.seed), system_prompt)
            row.update({f"eval_{k}": v for k, v in ev.items()}, eval_s=time.perf_counter() - t0)
        if it == cfg.num_iters:
            rows.append(row)
            if logger:
                logger.log(**row)
            break
        t0 = time.perf_counter()
        seeds = rng.sample(list(train_seeds), cfg.num_tasks)
        eps = lm_rollout(model, tokenizer, make_env, seeds, cfg.group_size, cfg.max_turns,
                         cfg.max_new_tokens, cfg.temperature, gen, system_prompt)
        t_gen = time.perf_counter() - t0
        adv = turn_advantages(eps, cfg)
        tok_adv = credit.to_token_advantages(eps, adv)
        N = max(len(ep.token_ids) for ep in eps)
        token_adv = torch.stack([F.pad(a, (0, N - len(a))) for a in tok_adv])  # (B, N)
        model.train()
        for _ in range(cfg.num_inner_epochs):
            loss, m = agent_loss(model, eps, token_adv, cfg)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            opt.step()
        model.eval()
        row.update(reward=float(np.mean([ep.ret for ep in eps])),
                   success=float(np.mean([ep.success for ep in eps])),
                   turns=float(np.mean([len(ep) for ep in eps])),
                   invalid=float(np.mean([1 - np.mean(ep.valid) for ep in eps])),
                   loss=loss.item(), gen_s=t_gen, step_s=time.perf_counter() - t0, **m)
        rows.append(row)
        if logger:
            logger.log(**row)
        if on_step:
            on_step(row)
    return rows


# --- SFT warm-start on a noisy scripted policy ---------------------------------------------------
def scripted_policy(epsilon: float, rng: np.random.Generator):
    """A ``play_episodes`` policy for ``GridAgentEnv``: with probability 1 - epsilon one of the
    optimal moves (uniformly among ties, from the task's exact Q*), else a uniformly random move."""
    from agentrl_lib.envs.tabular import q_from_v, value_iteration

    qcache = {}

    def act(envs, observations):
        out = []
        for env in envs:
            if rng.random() < epsilon:
                out.append(int(rng.integers(len(env.actions))))
                continue
            key = env.task
            if key not in qcache:
                mdp = env.tabular_form(*env.task)
                v, _, _, _ = value_iteration(mdp)
                qcache[key] = q_from_v(mdp, v).numpy()
            q = qcache[key][env.state_index()]  # (A,) in tabular order
            qt = np.array([q[env.action_index(a)] for a in env.actions])  # text order
            best = np.flatnonzero(qt >= qt.max() - 1e-9)
            out.append(int(rng.choice(best)))
        return out
    return act


@dataclass
class AgentSFTConfig:
    size: str = "tiny-64"
    """named model size (tiny_lm.SIZES)"""
    env_kwargs: dict = field(default_factory=dict)
    """GridAgentEnv(**env_kwargs) of the demonstrations (layout, max_turns, ...)"""
    epsilon: float = 0.3
    """the scripted policy's random-move probability (its demonstrations are imitated, noise too)"""
    num_episodes: int = 2000
    """demonstration episodes (task seeds 0 .. num_episodes-1 shifted by seed_offset)"""
    seed_offset: int = 1_000_000
    """demonstration task seeds start here, away from the RL training and eval seeds"""
    max_turns: int = 6
    steps: int = 300
    batch_size: int = 16
    lr: float = 1e-3
    """AdamW, linear warm-up over 5% then cosine decay (as sft.train_sft); 3e-3 stalls at the
    format (uniform over the moves) on the grid, 1e-3 learns to read the position"""
    system_prompt: str = SYSTEM_PROMPT
    seed: int = 0


AGENT_SFT_VERSION = 1


def train_agent_sft(cfg: AgentSFTConfig, verbose: bool = True):
    """Train the tiny LM from scratch on the scripted policy's conversations (loss on the agent
    tokens only). Returns (model, tokenizer, [(step, loss)])."""
    from agentrl_lib.envs.multiturn import GridAgentEnv
    from agentrl_lib.models.tiny_lm import new_model
    from agentrl_lib.rollout import play_episodes

    model, tok = new_model(cfg.size, seed=cfg.seed)
    rng = np.random.default_rng(cfg.seed)
    make_env = lambda: GridAgentEnv(**cfg.env_kwargs)  # noqa: E731
    seeds = [cfg.seed_offset + i for i in range(cfg.num_episodes)]
    eps = play_episodes(make_env, scripted_policy(cfg.epsilon, rng), seeds, 1, cfg.max_turns)
    text_episodes_to_tokens(tok, eps, cfg.system_prompt)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.01)
    warm = max(1, cfg.steps // 20)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (
        1 + math.cos(math.pi * min(1.0, s / cfg.steps))))
    history = []
    model.train()
    order = np.random.default_rng(cfg.seed + 1)
    for step in range(cfg.steps):
        batch = [eps[j] for j in order.choice(len(eps), min(cfg.batch_size, len(eps)), replace=False)]
        logps, _, mask = episode_token_logps(model, batch, pad_id=tok.pad_token_id)
        loss = -(logps * mask).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == cfg.steps - 1:
            history.append((step, loss.item()))
            if verbose:
                print(f"  agent sft step {step:4d}  loss {loss.item():.4f}", flush=True)
    model.eval()
    return model, tok, history


def agent_sft_checkpoint(cfg: AgentSFTConfig, verbose: bool = True):
    """The cached checkpoint folder of ``cfg`` (trained when missing), as ``sft.sft_checkpoint``:
    keyed by a hash of the config, written atomically under ``<cache>/sft/agent-...``."""
    from agentrl_lib.models.sft import cache_root, save_checkpoint

    blob = json.dumps({"v": AGENT_SFT_VERSION, **asdict(cfg)}, sort_keys=True, default=list)
    path = cache_root() / "sft" / f"agent-{cfg.size}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"
    if (path / "agentrl_sft.json").is_file() and (path / "config.json").is_file():
        return path
    if verbose:
        print(f"training the agent SFT model {cfg} (cached at {path} afterwards)")
    t0 = time.time()
    model, tok, history = train_agent_sft(cfg, verbose=verbose)
    save_checkpoint(model, tok, path, {"config": asdict(cfg), "history": history,
                                       "train_s": round(time.time() - t0, 1)})
    return path


def load_agent_sft(cfg: AgentSFTConfig, device: str = "cpu", verbose: bool = True):
    """(model, tokenizer) of the cached agent SFT checkpoint."""
    from agentrl_lib.models.tiny_lm import load_policy

    model, tok = load_policy(str(agent_sft_checkpoint(cfg, verbose)), device=device)
    return model.eval(), tok


# The agent SFT start of notebook 30's ci/cpu profiles, by name, so ``agentrl cache`` (and
# ``make test``) can build it once before the notebooks run.
AGENT_MODELS = {
    "grid-agent-tiny": AgentSFTConfig(env_kwargs=dict(layout=["...", ".#.", "..."], max_turns=4),
                                      epsilon=0.3, steps=1100, max_turns=4, lr=1e-3),
}
