"""Process rewards: a synthetic process reward model (PRM) and the reward designs of Gao et al.
(2024), *On Designing Effective RL Reward at Training Time for LLM Reasoning*, arXiv:2410.15115.

An episode is K scored steps with PRM scores s_0 .. s_{K-1} in [0, 1] (the reasoning steps and
the final answer line, which the PRM scores too), and a verified outcome: success in {0, 1} (0 for
an episode cut at a turn cap, which has no answer). The designs (``reward_type``):

- ``"success"``: only the outcome, r_K = success;
- ``"prm"``:     success + raw PRM, r_k = alpha s_k: the return is success + alpha sum_k s_k,
  which grows with every step the PRM likes, useful or not (the hack the paper reports);
- ``"clip"``:    r_k = alpha min(s_k - eta, 0): every step reward <= 0, so no trajectory earns
  more than its success reward by being long;
- ``"delta"``:   r_k = alpha (s_k - s_{k+1}) for k < K - 1 and r_{K-1} = alpha s_{K-1}: the sum
  from step t telescopes to alpha s_t, so the process part of any return is alpha s_0, bounded.

Inferred (stated in notebook 23): Clip as min(score - eta, 0) and Delta as the difference of
consecutive scores with the last step keeping its own score are the paper's two mechanisms as we
read them (Section 5 and its Figure of the two mechanisms); the weight ``alpha`` on the process
part and adding it to the success reward of the answer are our notation.

``synthetic_prm`` scores a step by whether it is correct (useful and redundant steps both are),
with an optional probability ``flip_prob`` of judging it the other way.

Shapes: B episodes, T turns. Pure functions; nothing here imports envs or models.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor
REWARD_TYPES = ("success", "prm", "clip", "delta")


def synthetic_prm(correct: Tensor, score_correct: float = 0.9, score_wrong: float = 0.1,
                  flip_prob: float = 0.0, generator: torch.Generator | None = None) -> Tensor:
    """PRM scores (B, T): ``score_correct`` where ``correct`` (B, T) bool, else ``score_wrong``;
    with probability ``flip_prob`` a step gets the other score (the PRM misjudges it)."""
    correct = torch.as_tensor(correct, dtype=torch.bool)
    if not 0.0 <= flip_prob <= 1.0:
        raise ValueError(f"flip_prob must lie in [0, 1], got {flip_prob}")
    judged = correct
    if flip_prob > 0:
        flip = torch.rand(correct.shape, generator=generator, dtype=torch.float64) < flip_prob
        judged = correct ^ flip
    return torch.where(judged, torch.tensor(score_correct, dtype=torch.float64),
                       torch.tensor(score_wrong, dtype=torch.float64))


def process_rewards(scores: Tensor, step_mask: Tensor, success: Tensor, reward_type: str = "prm",
                    alpha: float = 1.0, eta: float = 0.5, success_reward: float = 1.0
                    ) -> tuple[Tensor, dict]:
    """Per-turn rewards (B, T + 1) of one design; returns ``(rewards, metrics)``.

    scores (B, T): PRM score of each scored step; step_mask (B, T): 1 on an episode's K_b scored
    steps (its reasoning steps and its answer line), which come first (a prefix); success (B,):
    the verified outcome (0 for an episode cut at the cap). Column k < K_b holds step k's reward,
    column K_b the outcome's (``success_reward`` * success, paid after the last scored step); the
    rest are 0, so ``rewards.sum(-1)`` is the return.

    >>> s = torch.tensor([[0.9, 0.9, 0.1]]); m = torch.ones(1, 3, dtype=torch.bool)
    >>> process_rewards(s, m, torch.tensor([1.0]), "delta")[0]
    tensor([[0.0000, 0.8000, 0.1000, 1.0000]], dtype=torch.float64)
    >>> process_rewards(s, m, torch.tensor([1.0]), "clip")[0]
    tensor([[ 0.0000,  0.0000, -0.4000,  1.0000]], dtype=torch.float64)
    """
    scores = torch.as_tensor(scores, dtype=torch.float64)
    mask = torch.as_tensor(step_mask, dtype=torch.bool)
    success = torch.as_tensor(success, dtype=torch.float64)
    if scores.shape != mask.shape or scores.ndim != 2 or success.shape != scores.shape[:1]:
        raise ValueError(f"shapes: scores {tuple(scores.shape)}, step_mask {tuple(mask.shape)}, "
                         f"success {tuple(success.shape)}; expected (B, T), (B, T), (B,)")
    num_steps = mask.sum(-1)  # (B,)
    if not torch.equal(mask, torch.arange(mask.shape[1]) < num_steps[:, None]):
        raise ValueError("step_mask must mark a prefix of each row (the reasoning steps first)")
    m = mask.to(torch.float64)
    s = scores * m  # (B, T)
    if reward_type == "success":
        steps = torch.zeros_like(s)
    elif reward_type == "prm":
        steps = alpha * s
    elif reward_type == "clip":
        steps = alpha * torch.clamp(scores - eta, max=0.0) * m
    elif reward_type == "delta":
        nxt = torch.cat([s[:, 1:], torch.zeros_like(s[:, :1])], dim=1)  # s_{k+1}, 0 after the last
        steps = alpha * (s - nxt) * m
    else:
        raise ValueError(f"unknown reward_type {reward_type!r}; choose one of {REWARD_TYPES}")
    rewards = torch.cat([steps, torch.zeros_like(s[:, :1])], dim=1)  # (B, T + 1)
    rewards[torch.arange(len(success)), num_steps] += success_reward * success
    metrics = {"rewards/process": steps.sum(-1).mean().item(),
               "rewards/success": success.mean().item(),
               "rewards/return": rewards.sum(-1).mean().item(),
               "rewards/steps": num_steps.to(torch.float64).mean().item()}
    return rewards, metrics


def expected_step_rewards(reward_type: str, score_correct: float = 0.9, score_wrong: float = 0.1,
                          flip_prob: float = 0.0, alpha: float = 1.0, eta: float = 0.5
                          ) -> tuple[tuple[float, float], bool]:
    """The expected per-step reward of a correct and of a wrong step under ``synthetic_prm``,
    for the exact tabular form: ``((r_correct, r_wrong), first_step_only)``. For Delta the
    per-step rewards depend on the next step's score, but every episode's process return is
    alpha s_0, so the exact MDP pays E[alpha s_0] at the first step only (the same return for
    every trajectory, hence the same optimal policies; the sampled per-step rewards differ)."""
    def e_score(correct: bool, f):  # E[f(score)] for a correct / wrong step
        own, other = (score_correct, score_wrong) if correct else (score_wrong, score_correct)
        return (1 - flip_prob) * f(own) + flip_prob * f(other)

    if reward_type == "success":
        return (0.0, 0.0), False
    if reward_type in ("prm", "delta"):
        r = tuple(alpha * e_score(c, lambda x: x) for c in (True, False))
        return r, reward_type == "delta"
    if reward_type == "clip":
        return tuple(alpha * e_score(c, lambda x: min(x - eta, 0.0)) for c in (True, False)), False
    raise ValueError(f"unknown reward_type {reward_type!r}; choose one of {REWARD_TYPES}")


def rewards_to_go(rewards: Tensor) -> Tensor:
    """G_t = sum_{t' >= t} r_t' (undiscounted), (B, T) -> (B, T)."""
    return rewards.flip(-1).cumsum(-1).flip(-1)
