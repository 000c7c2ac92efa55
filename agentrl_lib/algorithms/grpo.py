"""The critic-free policy-gradient family for language models: REINFORCE, RLOO, GRPO, Dr. GRPO,
DAPO and Lite-PPO, as one loss chosen by config fields, and the training loop around it.

Papers (each field says where it comes from):
- GRPO: Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300 (group mean/std advantage, per-sequence
  token mean, k3 KL to a reference).
- RLOO: Ahmadian et al. 2024, arXiv:2402.14740 (leave-one-out baseline).
- Dr. GRPO: Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783 (no std
  division; sum over tokens divided by a constant, B * max_completion_length).
- DAPO: Yu et al. 2025, arXiv:2503.14476 (clip-higher eps_high = 0.28, dynamic sampling,
  token-level aggregation, overlong reward shaping).
- Lite-PPO: Liu et al. 2025, "Part I: Tricks or Traps? A Deep Dive into RL for LLM Reasoning",
  arXiv:2508.08221 (group-mean advantage with batch-level std, token-level aggregation, the plain
  PPO clipped loss).

Aggregation names follow TRL's GRPOTrainer ``loss_type`` (1.16): ``seq_mean`` is TRL's "grpo",
``token_mean`` is "bnpo" (and "dapo" for a single process), ``const_norm`` is "dr_grpo".
``tests/test_grpo.py`` checks the loss against TRL's ``_compute_loss`` on the same inputs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

import torch

from agentrl_lib import core

Tensor = torch.Tensor
ADVANTAGES = ("reinforce", "reinforce_baseline", "rloo", "grpo", "dr_grpo", "lite_ppo")
AGGREGATIONS = ("seq_mean", "token_mean", "const_norm")


@dataclass
class GRPOConfig:
    advantage: str = "grpo"
    """how rewards (B, G) become advantages: 'reinforce' (the reward itself), 'reinforce_baseline'
    (minus the batch mean), 'rloo' (leave-one-out), 'grpo' (group mean and std), 'dr_grpo' (group
    mean only), 'lite_ppo' (group mean, batch std)"""
    std_ddof: int = 1
    """ddof of the std in 'grpo' and 'lite_ppo' (1 as torch.std and TRL)"""
    loss_agg: str = "seq_mean"
    """'seq_mean' (mean over each sequence's tokens, then over sequences: GRPO), 'token_mean' (mean
    over every token of the batch: DAPO, Lite-PPO), 'const_norm' (sum / (B * max_new_tokens): Dr. GRPO)"""
    clip_eps: float = 0.2
    """PPO clip range (lower side; also the upper side unless clip_eps_high is set)"""
    clip_eps_high: float | None = None
    """upper clip (DAPO's clip-higher: 0.28)"""
    beta: float = 0.0
    """weight of the KL penalty to the reference (initial) policy; 0 skips the reference model"""
    kl_estimator: str = "k3"
    """'k1', 'k2' or 'k3' (GRPO uses k3)"""
    dynamic_sampling: bool = False
    """drop groups whose rewards are all equal (they carry no gradient) before the update (DAPO)"""
    overlong_buffer: int = 0
    """DAPO soft overlong punishment: length window before max_new_tokens where a linear penalty
    grows to ``overlong_penalty``; 0 turns it off"""
    overlong_penalty: float = 1.0
    overlong_filter: bool = False
    """leave truncated completions (no end-of-sequence within max_new_tokens) out of the loss
    (DAPO's overlong filtering; one of the tricks ablated in Tricks or Traps)"""
    num_prompts: int = 16
    """prompts per update"""
    group_size: int = 8
    """completions per prompt (G)"""
    num_iters: int = 100
    """updates (one generation round each)"""
    num_inner_epochs: int = 1
    """optimizer steps on each generation round (>1 makes the ratio and clipping matter)"""
    lr: float = 1e-3
    max_new_tokens: int = 8
    temperature: float = 1.0
    max_grad_norm: float = 1.0
    eval_every: int = 10
    seed: int = 0

    def __post_init__(self):
        if self.advantage not in ADVANTAGES:
            raise ValueError(f"unknown advantage {self.advantage!r}; choose one of {ADVANTAGES}")
        if self.loss_agg not in AGGREGATIONS:
            raise ValueError(f"unknown loss_agg {self.loss_agg!r}; choose one of {AGGREGATIONS}")
        if self.group_size < 2 and self.advantage in ("rloo", "grpo", "dr_grpo", "lite_ppo"):
            raise ValueError(f"advantage {self.advantage!r} needs group_size >= 2")


def preset(name: str, **overrides) -> GRPOConfig:
    """The named methods as config values (each paper's choices, see the module docstring)."""
    if name == "reinforce":
        cfg = GRPOConfig(advantage="reinforce_baseline", loss_agg="seq_mean")
    elif name == "rloo":
        cfg = GRPOConfig(advantage="rloo", loss_agg="seq_mean")
    elif name == "grpo":
        cfg = GRPOConfig(advantage="grpo", loss_agg="seq_mean")
    elif name == "dr_grpo":
        cfg = GRPOConfig(advantage="dr_grpo", loss_agg="const_norm")
    elif name == "dapo":
        cfg = GRPOConfig(advantage="grpo", loss_agg="token_mean", clip_eps_high=0.28,
                         dynamic_sampling=True, overlong_buffer=2)
    elif name == "lite_ppo":
        cfg = GRPOConfig(advantage="lite_ppo", loss_agg="token_mean")
    else:
        raise ValueError(f"unknown preset {name!r}; choose reinforce, rloo, grpo, dr_grpo, dapo, lite_ppo")
    return replace(cfg, **overrides)


def compute_advantages(rewards: Tensor, cfg: GRPOConfig) -> Tensor:
    """rewards (B, G) -> advantages (B, G), one per completion."""
    if cfg.advantage == "reinforce":
        return rewards.clone()
    if cfg.advantage == "reinforce_baseline":
        return rewards - rewards.mean()
    if cfg.advantage == "rloo":
        return core.rloo_advantages(rewards)
    if cfg.advantage == "grpo":
        return core.grpo_advantages(rewards, scale=True, ddof=cfg.std_ddof)
    if cfg.advantage == "dr_grpo":
        return core.grpo_advantages(rewards, scale=False)
    # lite_ppo: group-mean centring, batch-level std (Tricks or Traps, section 4)
    centred = rewards - rewards.mean(-1, keepdim=True)  # (B, G)
    return centred / (rewards.std(correction=cfg.std_ddof) + 1e-4)


def overlong_penalty(lengths: Tensor, max_len: int, buffer: int, penalty: float = 1.0) -> Tensor:
    """DAPO's soft overlong punishment (eq. 13): 0 up to max_len - buffer, then falling linearly
    to -penalty at max_len.

    >>> overlong_penalty(torch.tensor([4, 7, 8]), max_len=8, buffer=2).tolist()
    [0.0, -0.5, -1.0]
    """
    if buffer <= 0:
        return torch.zeros(lengths.shape)
    over = (lengths.float() - (max_len - buffer)).clamp(min=0.0)
    return 0.0 - penalty * (over / buffer).clamp(max=1.0)  # 0.0 - x: no negative zeros


def policy_loss(logps: Tensor, old_logps: Tensor, advantages: Tensor, mask: Tensor,
                cfg: GRPOConfig, ref_logps: Tensor | None = None,
                max_completion_length: int | None = None) -> tuple[Tensor, dict]:
    """The clipped surrogate with the chosen aggregation, plus beta * KL.

    logps, old_logps, mask: (B, T); advantages: (B,) one per sequence or (B, T) per token.
    per-token loss l_t = -min(rho_t A, clip(rho_t, 1 - eps, 1 + eps_high) A) + beta * KL_t.
    """
    adv = advantages[:, None] if advantages.dim() == 1 else advantages  # (B, 1) or (B, T)
    m = mask.to(logps.dtype)
    ratio = torch.exp(logps - old_logps)  # (B, T)
    eps_high = cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high
    clipped_ratio = torch.clamp(ratio, 1 - cfg.clip_eps, 1 + eps_high)
    per_token = -torch.min(ratio * adv, clipped_ratio * adv)  # (B, T)
    kl = None
    if cfg.beta != 0.0:
        if ref_logps is None:
            raise ValueError("beta != 0 needs ref_logps")
        kl = core.kl_estimate(logps, ref_logps, cfg.kl_estimator)  # (B, T)
        per_token = per_token + cfg.beta * kl
    if cfg.loss_agg == "seq_mean":
        loss = ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
    elif cfg.loss_agg == "token_mean":
        loss = (per_token * m).sum() / m.sum().clamp(min=1.0)
    else:
        T = max_completion_length or logps.shape[1]
        loss = (per_token * m).sum() / (logps.shape[0] * T)
    with torch.no_grad():
        adv_b = adv.expand_as(ratio)
        clipped = ((ratio < 1 - cfg.clip_eps) & (adv_b < 0)) | ((ratio > 1 + eps_high) & (adv_b > 0))
        metrics = {"clip_ratio": core.masked_mean(clipped.to(m.dtype), m).item()}
        if kl is not None:
            metrics["kl"] = core.masked_mean(kl, m).item()
    return loss, metrics


def format_prompts(tokenizer, problems: list[dict]) -> list[str]:
    return [tokenizer.apply_chat_template([{"role": "user", "content": p["prompt"]}],
                                          add_generation_prompt=True, tokenize=False)
            for p in problems]


def score(reward_funcs, texts: list[str], problems: list[dict]) -> Tensor:
    """Sum of the reward functions (TRL signature) over aligned completions and problem columns."""
    columns = {k: [p.get(k) for p in problems] for k in problems[0] if k != "prompt"}
    total = torch.zeros(len(texts))
    for f in reward_funcs:
        total += torch.tensor(f(texts, **columns), dtype=torch.float32)
    return total


@torch.no_grad()
def evaluate(model, tokenizer, problems: list[dict], reward_fn, max_new_tokens: int,
             batch_size: int = 256) -> float:
    """Greedy accuracy: mean of ``reward_fn`` over the panel."""
    from agentrl_lib.rollout import generate

    model.eval()
    total = 0.0
    for i in range(0, len(problems), batch_size):
        chunk = problems[i:i + batch_size]
        gen = generate(model, tokenizer, format_prompts(tokenizer, chunk), max_new_tokens, greedy=True)
        total += score([reward_fn], gen.texts, chunk).sum().item()
    return total / len(problems)


def train(model, tokenizer, train_problems: list[dict], reward_funcs: list, cfg: GRPOConfig,
          eval_problems: list[dict] | None = None, eval_reward=None, logger=None,
          ref_model=None, on_step=None) -> list[dict]:
    """The loop: sample prompts, generate G completions each, score, advantages, update.

    Returns the logged rows (step, reward, eval accuracy when measured, timings, loss metrics).
    ``ref_model`` is needed only when cfg.beta != 0.
    """
    import random

    from agentrl_lib.rollout import generate, sequence_logps

    rng = random.Random(cfg.seed)
    gen_rng = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    rows = []
    eval_reward = eval_reward or reward_funcs[0]
    for it in range(cfg.num_iters + 1):
        row = {"step": it}
        if eval_problems is not None and (it % cfg.eval_every == 0 or it == cfg.num_iters):
            row["eval_acc"] = evaluate(model, tokenizer, eval_problems, eval_reward, cfg.max_new_tokens)
        if it == cfg.num_iters:
            rows.append(row)
            if logger:
                logger.log(**row)
            break
        t0 = time.time()
        batch = rng.sample(train_problems, cfg.num_prompts)
        problems = [p for p in batch for _ in range(cfg.group_size)]  # (B*G) prompt-major
        model.eval()
        gen = generate(model, tokenizer, format_prompts(tokenizer, problems), cfg.max_new_tokens,
                       temperature=cfg.temperature, generator=gen_rng)
        t_gen = time.time() - t0
        device = gen.logps.device  # rewards and advantages live with the model (CPU or CUDA)
        rewards = score(reward_funcs, gen.texts, problems).to(device)  # (B*G,)
        lengths = gen.completion_mask.sum(-1)
        if cfg.overlong_buffer > 0:
            rewards = rewards + overlong_penalty(lengths, cfg.max_new_tokens, cfg.overlong_buffer,
                                                 cfg.overlong_penalty).to(device)
        adv = compute_advantages(rewards.view(cfg.num_prompts, cfg.group_size), cfg).reshape(-1)
        keep = torch.ones_like(rewards, dtype=torch.bool)
        if cfg.overlong_filter:
            keep &= (gen.completion_ids == tokenizer.eos_token_id).any(-1)
        if cfg.dynamic_sampling:
            std = rewards.view(cfg.num_prompts, cfg.group_size).std(-1)
            keep &= (std > 0).repeat_interleave(cfg.group_size)
        row.update(reward=rewards.mean().item(), completion_len=lengths.float().mean().item(),
                   kept_frac=keep.float().mean().item(), gen_s=t_gen)
        if keep.any():
            idx = keep.nonzero().squeeze(-1)
            args = (gen.prompt_ids[idx], gen.prompt_mask[idx], gen.completion_ids[idx],
                    gen.completion_mask[idx])
            ref_logps = None
            if cfg.beta != 0.0:
                with torch.no_grad():
                    ref_logps, _ = sequence_logps(ref_model, *args, temperature=cfg.temperature)
            model.train()
            for _ in range(cfg.num_inner_epochs):
                logps, ents = sequence_logps(model, *args, temperature=cfg.temperature)
                loss, m = policy_loss(logps, gen.logps[idx], adv[idx], gen.completion_mask[idx],
                                      cfg, ref_logps, cfg.max_new_tokens)
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
                opt.step()
            row.update(loss=loss.item(), entropy=core.masked_mean(
                ents.detach(), gen.completion_mask[idx]).item(), **m)
        row["step_s"] = time.time() - t0
        rows.append(row)
        if logger:
            logger.log(**row)
        if on_step:
            on_step(row)
    model.eval()
    return rows
