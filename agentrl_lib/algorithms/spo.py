"""Self-Play Preference Optimisation (Swamy et al. 2024) on a response bandit, against the
reward-model route.

**SPO.** One policy plays itself: draw N responses y_1..y_N ~ pi, let the labeller compare every
pair, and reward each response by its win proportion against the other samples,

    r_i = 1/(N-1) sum_{j != i} 1[y_i preferred to y_j]        # E[r_i | y_i] = (P @ pi)[y_i]

then take a policy-gradient step on r (no reward model). The expected reward of response y is
its win rate against the current policy, so SPO plays the symmetric zero-sum game P - 1/2 against
itself; with a no-regret learner the *average* policy converges to the Minimax Winner (the
paper's Theorem; the last iterate may cycle around it). An entropy bonus ``alpha`` (the paper
trains with soft RL: SAC/PPO with an entropy term) damps the cycle of the last iterate.

**The reward-model route (RLHF).** Fit a Bradley-Terry reward model (one score per response, the
maximum-likelihood fit of ``rewards.reward_model.bt_loss``) on pairwise comparisons of responses drawn from the initial
policy, then run the same policy gradient on r_hat. A BT model orders the responses totally, so
under intransitive preferences its maximiser is one arm.

Both arms share ``pg_step``: REINFORCE on a softmax table with a mean baseline over the N samples
and the soft reward r - alpha log pi(y).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from agentrl_lib.envs.pref_bandit import PrefBandit, exploitability, total_variation
from agentrl_lib.utils import optimizer_step, progress

ARMS = ("spo", "reward_model")


def softmax(theta) -> np.ndarray:
    z = np.asarray(theta, dtype=np.float64)
    e = np.exp(z - z.max())
    return e / e.sum()


def self_play_rewards(wins) -> np.ndarray:
    """SPO's reward of each of N samples from one (N, N) outcome matrix ``wins[i, j]`` = 1 where
    sample i beat sample j (only i != j read): ``r_i = sum_{j != i} wins[i, j] / (N - 1)``, (N,).

    >>> self_play_rewards(np.array([[0, 1, 1], [0, 0, 1], [0, 0, 0]]))
    array([1. , 0.5, 0. ])
    """
    w = np.asarray(wins, dtype=np.float64)
    N = w.shape[0]
    if w.shape != (N, N) or N < 2:
        raise ValueError(f"wins must be an (N, N) matrix with N >= 2, got {w.shape}")
    off = ~np.eye(N, dtype=bool)
    return (w * off).sum(1) / (N - 1)  # (N,)


def sample_wins(bandit: PrefBandit, ys, rng) -> np.ndarray:
    """Compare every pair of samples once with the labeller: (N, N), wins[i, j] + wins[j, i] = 1
    off the diagonal, 0 on it."""
    ys = np.asarray(ys)
    N = len(ys)
    iu, ju = np.triu_indices(N, 1)
    lab = bandit.compare(ys[iu], ys[ju], rng)  # (N(N-1)/2,)
    wins = np.zeros((N, N))
    wins[iu, ju] = lab
    wins[ju, iu] = 1.0 - lab
    return wins


def pg_step(theta, ys, rewards, lr: float, alpha: float = 0.0) -> tuple[np.ndarray, dict]:
    """One REINFORCE step on softmax logits theta (K,) from N samples ys with rewards (N,):

        g = 1/N sum_i (r~_i - mean_j r~_j) grad log pi(y_i),   r~_i = r_i - alpha log pi(y_i)

    (grad_theta log pi(y) = e_y - pi). Returns (theta + lr g, metrics)."""
    theta = np.asarray(theta, dtype=np.float64)
    pi = softmax(theta)
    ys = np.asarray(ys)
    r = np.asarray(rewards, dtype=np.float64) - alpha * np.log(pi[ys])  # (N,)
    adv = r - r.mean()  # (N,)
    g = np.bincount(ys, weights=adv, minlength=len(theta)) - adv.sum() * pi  # (K,)
    g /= len(ys)
    return theta + lr * g, {"pg/grad_norm": float(np.linalg.norm(g)),
                            "pg/reward_mean": float(np.mean(rewards))}


def fit_tabular_bt(K: int, chosen, rejected, l2: float = 1e-3, num_steps: int = 50,
                   tol: float = 1e-10) -> tuple[np.ndarray, dict]:
    """Maximum-likelihood Bradley-Terry utilities (K,) (centred) from (M,) chosen/rejected response
    indices: Newton's method on the loss of ``reward_model.bt_loss`` (the mean of
    -log sigma(u_c - u_r) over the M pairs) + l2/2 |u|^2 (the ridge keeps a never-beaten response
    finite). The pairs are counted into K^2 ordered pairs first, so the cost is independent of M.
    ``reward_model.fit`` of a ``TabularRM`` reaches the same utilities (tested, and in notebook 28).
    """
    counts = np.zeros((K, K))
    np.add.at(counts, (np.asarray(chosen), np.asarray(rejected)), 1.0)
    w = counts / counts.sum()  # (K, K) weight of "c beat r"
    u = np.zeros(K)
    for it in range(num_steps):
        s = 1.0 / (1.0 + np.exp(-(u[:, None] - u[None, :])))  # (K, K) sigma(u_c - u_r)
        a = w * (s - 1.0)  # d loss / d (u_c - u_r)
        grad = a.sum(1) - a.sum(0) + l2 * u  # (K,)
        c = w * s * (1.0 - s)  # curvature of each ordered pair
        c = c + c.T
        H = np.diag(c.sum(1)) - c + l2 * np.eye(K)  # (K, K) Laplacian-like Hessian
        step = np.linalg.lstsq(H, grad, rcond=None)[0]
        u = u - step
        if np.abs(step).max() < tol:
            break
    s = 1.0 / (1.0 + np.exp(-(u[:, None] - u[None, :])))
    loss = float(-(w * np.log(s)).sum() + 0.5 * l2 * u @ u)
    acc = float((w * (u[:, None] > u[None, :])).sum())
    return u - u.mean(), {"rm/loss": loss, "rm/accuracy": acc, "rm/newton_steps": it + 1}


@dataclass
class SPOConfig:
    arm: str = "spo"
    """'spo' (win-proportion reward by self-play) or 'reward_model' (BT reward model, then PG)"""
    num_iters: int = 500
    """policy-gradient steps"""
    num_samples: int = 8
    """N responses drawn from the policy per step (SPO compares all N(N-1)/2 pairs)"""
    lr: float = 1.0
    """step size of the REINFORCE update on the logits"""
    alpha: float = 0.02
    """entropy bonus: the soft reward r - alpha log pi(y) (both arms)"""
    rm_num_pairs: int | None = None
    """comparisons the reward model is fitted on, pairs drawn uniformly (the initial policy);
    None: the same number SPO's labeller answers over training, num_iters N(N-1)/2"""
    rm_l2: float = 1e-3
    """ridge weight of the BT fit"""
    seed: int = 0

    def __post_init__(self):
        if self.arm not in ARMS:
            raise ValueError(f"unknown arm {self.arm!r}; expected one of {list(ARMS)}")
        if self.num_samples < 2:
            raise ValueError("num_samples must be >= 2 (self-play compares samples)")


def train(bandit: PrefBandit, cfg: SPOConfig, theta0=None, target=None) -> dict:
    """Run one arm on the bandit. Returns a dict of per-iteration curves (lists, the policy before
    each step and after the last): ``exploitability`` (last iterate), ``avg_exploitability``
    (the running average policy, SPO's guarantee), ``tv`` and ``avg_tv`` to ``target`` (when
    given, e.g. the Minimax Winner), plus ``final_pi``, ``avg_pi`` and ``r_hat`` (reward_model)."""
    rng = np.random.default_rng(cfg.seed)
    K, N = bandit.K, cfg.num_samples
    theta = np.zeros(K) if theta0 is None else np.asarray(theta0, np.float64).copy()
    out = {k: [] for k in ("exploitability", "avg_exploitability", "tv", "avg_tv")}
    r_hat = None
    if cfg.arm == "reward_model":
        M = cfg.rm_num_pairs or cfg.num_iters * N * (N - 1) // 2
        pi0 = softmax(theta)
        i, j = rng.choice(K, size=M, p=pi0), rng.choice(K, size=M, p=pi0)
        y = bandit.compare(i, j, rng)  # (M,)
        r_hat, out["rm_metrics"] = fit_tabular_bt(K, np.where(y > 0, i, j), np.where(y > 0, j, i),
                                                  l2=cfg.rm_l2)
    pi_sum = np.zeros(K)

    def log(pi, t):
        out["exploitability"].append(exploitability(pi, bandit.P))
        out["avg_exploitability"].append(exploitability(pi_sum / t, bandit.P))
        if target is not None:
            out["tv"].append(total_variation(pi, target))
            out["avg_tv"].append(total_variation(pi_sum / t, target))

    for t in progress(range(cfg.num_iters), desc="spo"):
        pi = softmax(theta)
        pi_sum += pi
        log(pi, t + 1)
        ys = rng.choice(K, size=N, p=pi)
        if cfg.arm == "spo":
            rewards = self_play_rewards(sample_wins(bandit, ys, rng))
        else:
            rewards = r_hat[ys]
        theta, _ = pg_step(theta, ys, rewards, cfg.lr, cfg.alpha)
    out["final_pi"] = softmax(theta)
    out["avg_pi"] = pi_sum / cfg.num_iters
    out["r_hat"] = r_hat
    return out


# --- the language-model rung: a restricted response set -------------------------------------------
def lm_train(model, tokenizer, prompts: list[str], candidates: list[list[str]], bandit: PrefBandit,
             cfg: SPOConfig, target=None, optimizer: str = "sgd") -> dict:
    """Both arms with the LM as the policy over each prompt's K candidates: pi(y_k | x_s) =
    softmax over the set of the LM's sequence log-probs (``inpo.lm_candidate_logps``), one
    preference matrix ``bandit.P`` over the candidate slots for every prompt. Each step draws
    ``cfg.num_samples`` candidates per prompt from the LM's current distribution and takes one
    ``optimizer`` step ('sgd', plain gradient steps like ``pg_step``, or 'adam'; learning rate
    ``cfg.lr``) on all the LM's parameters, minimising

        - 1/S sum_s 1/N sum_i (r~_{s,i} - mean_j r~_{s,j}) log pi(y_{s,i} | x_s),
        r~ = r - alpha log pi(y)

    (``pg_step``'s REINFORCE on the set's log-probs). ``spo``: r = the win proportion of each sample
    against the other samples of its prompt (``self_play_rewards``); ``reward_model``: r = r_hat[y],
    the BT utilities over the K slots (``fit_tabular_bt``) of ``cfg.rm_num_pairs`` comparisons of
    candidates drawn uniformly over each set (None: as many as SPO queries, num_iters S N(N-1)/2).
    Trains ``model`` in place. Returns curves (the policy before each step and after the last, mean
    over prompts): ``exploitability`` (last iterate), ``avg_exploitability`` (each prompt's running
    average policy), ``tv``/``avg_tv`` to ``target``; ``final_pi``, ``avg_pi`` (S, K), ``r_hat``."""
    import torch

    from agentrl_lib.algorithms.inpo import candidate_rounds

    rng = np.random.default_rng(cfg.seed)
    S, K, N = len(prompts), bandit.K, cfg.num_samples
    if len(candidates) != S or any(len(c) != K for c in candidates):
        raise ValueError(f"candidates must hold one list of K = {K} strings per prompt")
    r_hat = None
    out = {k: [] for k in ("exploitability", "avg_exploitability", "tv", "avg_tv")}
    if cfg.arm == "reward_model":
        M = cfg.rm_num_pairs or cfg.num_iters * S * N * (N - 1) // 2
        i, j = rng.integers(0, K, M), rng.integers(0, K, M)
        y = bandit.compare(i, j, rng)  # (M,)
        r_hat, out["rm_metrics"] = fit_tabular_bt(K, np.where(y > 0, i, j), np.where(y > 0, j, i),
                                                  l2=cfg.rm_l2)
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    elif optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    else:
        raise ValueError(f"unknown optimizer {optimizer!r}; expected 'sgd' or 'adam'")
    pi_sum = np.zeros((S, K))

    def log(pi, t):
        avg = pi_sum / t
        out["exploitability"].append(float(np.mean([exploitability(p, bandit.P) for p in pi])))
        out["avg_exploitability"].append(float(np.mean([exploitability(p, bandit.P) for p in avg])))
        if target is not None:
            out["tv"].append(float(np.mean([total_variation(p, target) for p in pi])))
            out["avg_tv"].append(float(np.mean([total_variation(p, target) for p in avg])))

    def round_fn(t, logp, pi):  # logp: (S, K) with gradients
        pi_sum[:] += pi
        log(pi, t + 1)
        ys = np.stack([rng.choice(K, size=N, p=p) for p in pi])  # (S, N)
        if cfg.arm == "spo":
            rewards = np.stack([self_play_rewards(sample_wins(bandit, y_s, rng)) for y_s in ys])
        else:
            rewards = r_hat[ys]  # (S, N)
        lp = logp.gather(1, torch.as_tensor(ys, dtype=torch.long, device=logp.device))  # (S, N)
        soft = torch.as_tensor(rewards, dtype=lp.dtype, device=lp.device) - cfg.alpha * lp.detach()
        adv = soft - soft.mean(1, keepdim=True)
        optimizer_step(opt, -(adv * lp).mean())

    pi = candidate_rounds(model, tokenizer, prompts, candidates, cfg.num_iters, round_fn,
                          with_grad=True, desc=f"spo ({cfg.arm})")[-1]
    out["final_pi"] = pi
    out["avg_pi"] = pi_sum / cfg.num_iters
    out["r_hat"] = r_hat
    return out
