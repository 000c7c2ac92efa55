"""V_{0.5}: a generalist value model's prediction as a prior for the advantage baseline of sparse
rollouts, with a reliability test and extra rollouts on demand.

Zhang, Sun, Hao, Gu, Cai, Zhan, Ye (2026), "V_{0.5}: Generalist Value Model as a Prior for Sparse
RL Rollouts", arXiv:2603.10848. In RLVR the advantage baseline of a prompt is its success rate.
GRPO estimates it by the mean of the prompt's G rollouts: unbiased but noisy when G is small
(G = 4). A generalist value model (V_0) predicts the success rate without rollouts: cheap, low
variance, but possibly biased or hallucinated. V_{0.5} fuses the two so as to minimise the
baseline's mean squared error, tests in real time whether the prior can be trusted, and when the
test rejects it draws extra rollouts for that prompt.

What the abstract and project page state: the fusion of prior and empirical mean, a hypothesis test
of the prior's reliability, dynamic allocation of extra rollout budget when it is rejected, the
goal of minimising the baseline's MSE. **Inferred here** (the paper's exact estimators were not
read): the precision-weighted (normal-normal) shrinkage form of the fusion and its variances, the
z statistic, the allocation rule and its budget cap, dropping the prior for a rejected prompt.

For prompt i with prior v_i in (0, 1), n_i rollouts r_ij in {0, 1} and empirical mean m_i:

    sigma^2_i = v_i (1 - v_i)                      per-rollout variance under H0 "p_i = v_i"
    tau^2      = prior_var                          the prior's error variance (its calibration)
    w_i = (sigma^2_i / n_i) / (sigma^2_i / n_i + tau^2) = sigma^2_i / (sigma^2_i + n_i tau^2)
    b_i = w_i v_i + (1 - w_i) m_i                   (fusion: inverse-variance weights)

If v_i ~ p_i + e (E e = 0, Var e = tau^2) and m_i ~ p_i + noise of variance sigma^2_i / n_i, this
b_i is the minimum-MSE linear combination, MSE = 1 / (1 / tau^2 + n_i / sigma^2_i), below both
tau^2 (the prior alone) and sigma^2_i / n_i (GRPO's mean). The weight uses the prior's own
sigma^2_i, so for a given prior it does not depend on the rewards.

Reliability test (on the first G rollouts): under H0 the discrepancy m_i - v_i has variance
sigma^2_i / G + tau^2, so

    z_i = (m_i - v_i) / sqrt(sigma^2_i / G + tau^2),      reject the prior if |z_i| > z_crit.

Allocation: a rejected prompt's baseline is its empirical mean alone, whose MSE is p(1-p)/n; it
gets k_i extra rollouts, the fewest with sigmahat^2_i / (G + k_i) <= mse_target (sigmahat^2 from the
Laplace-smoothed rate (s + 1)/(n + 2), so an all-0 group still has a variance), at most
``max_extra`` each, and at most ``extra_per_prompt * B`` extra rollouts in a round of B prompts
(when the wishes exceed the cap, rollouts go one at a time to the prompt whose MSE drops most,
sigmahat^2 / n - sigmahat^2 / (n + 1)). Every extra rollout is counted in the round's ``rollouts``.

Leave-one-out or not (``leave_one_out``): GRPO's group mean uses the sample's own reward, which
shrinks the expected gradient to (G - 1)/G of the true one; the fused baseline, not left-one-out,
shrinks it to 1 - (1 - w)/n (the own reward enters b with weight (1 - w)/n). With
``leave_one_out=True`` sample j's baseline uses the other n - 1 rewards (and w at n - 1): unbiased
for a fixed test decision. The test and the allocation still read all first G rewards, so V_{0.5}
with the test keeps a small bias either way: ``estimator_study`` measures it.

Estimators (``estimator``): ``'grpo'`` (group mean; no std division, as Dr. GRPO: the learner is
REINFORCE on the logit), ``'dapo'`` (group mean with DAPO's dynamic sampling: all-0 / all-1 groups
are dropped and fresh prompts drawn, up to ``max_resample_rounds`` more rounds, every rollout
counted), ``'fused'`` (the fusion for every prompt, no test, no extra rollouts: the ablation, and the
control that a biased prior hurts), ``'v05'`` (fusion + test + allocation).

Functions: ``fusion_weight``, ``fused_baseline`` (also the group mean when ``prior`` is None),
``prior_test``, ``allocate_extra``, ``policy_gradient`` (pure, (value, metrics)); ``sample_round``
(one round on a ``PromptBandit``); ``train`` (the loop at a rollout budget); ``estimator_study``
(baseline MSE, gradient MSE and bias over many draws at a frozen learner); ``curve_on_grid``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from agentrl_lib.core import all_equal
from agentrl_lib.utils import progress

ESTIMATORS = ("grpo", "dapo", "fused", "v05")


@dataclass
class V05Config:
    estimator: str = "v05"
    """'grpo', 'dapo', 'fused' or 'v05' (module docstring)"""
    num_prompts: int = 16
    """B, prompts (groups) per round"""
    group_size: int = 4
    """G, rollouts per prompt before any extra (the paper's sparse setting: 4)"""
    lr: float = 2.0
    """step on the prompt's logit: theta_i += lr * g_i"""
    rollout_budget: int = 4096
    """the loop stops once this many rollouts (every one: extra and dropped included) are spent"""
    leave_one_out: bool = False
    """sample j's baseline from the other rollouts of its prompt (unbiased for a fixed decision)"""
    prior_var: float = 0.01
    """tau^2, the error variance the fusion assumes for the prior (its calibration; inferred)"""
    z_crit: float = 2.0
    """reject the prior when |z| exceeds this (about a 5% two-sided test; inferred)"""
    mse_target: float = 0.02
    """a rejected prompt gets rollouts until sigmahat^2 / n <= this (inferred)"""
    pooled_test: bool = True
    """also test the round's pooled discrepancy (a systematic bias) and reject the whole round's
    prior when it fails (inferred; ``prior_test``)"""
    max_extra: int = 8
    """extra rollouts at most per rejected prompt"""
    extra_per_prompt: float = 2.0
    """a round of B prompts draws at most extra_per_prompt * B extra rollouts"""
    max_resample_rounds: int = 2
    """DAPO: further sampling rounds to refill the dropped groups"""

    def __post_init__(self):
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"estimator must be one of {ESTIMATORS}, got {self.estimator!r}")
        if self.group_size < 1 or self.num_prompts < 1:
            raise ValueError("group_size and num_prompts must be >= 1")
        if self.leave_one_out and self.group_size < 2:
            raise ValueError("leave_one_out needs group_size >= 2")
        if self.prior_var < 0 or self.mse_target <= 0 or self.max_extra < 0 or self.extra_per_prompt < 0:
            raise ValueError("prior_var >= 0, mse_target > 0, max_extra >= 0, extra_per_prompt >= 0")


def _counts(r: np.ndarray, mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r = np.asarray(r, dtype=np.float64)  # (B, N)
    mask = np.ones_like(r, dtype=bool) if mask is None else np.asarray(mask, dtype=bool)  # (B, N)
    if r.shape != mask.shape or r.ndim != 2:
        raise ValueError(f"rewards and mask must be (B, N) alike, got {r.shape} and {mask.shape}")
    n = mask.sum(1)  # (B,)
    s = (r * mask).sum(1)  # (B,)
    return r, mask, n, s


def fusion_weight(prior, n, prior_var: float) -> tuple[np.ndarray, dict]:
    """w = sigma^2 / (sigma^2 + n tau^2), sigma^2 = v (1 - v): the prior's share of the fused
    baseline with n rollouts. (B,), (B,) -> ((B,), metrics). n = 0 or tau^2 = 0 gives w = 1.

    >>> fusion_weight([0.5, 0.5, 0.2], [4, 0, 4], 0.0625)[0].round(4).tolist()
    [0.5, 1.0, 0.3902]
    """
    v = np.asarray(prior, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    sigma2 = v * (1.0 - v)  # (B,)
    den = sigma2 + n * prior_var  # (B,)
    w = np.where(den > 0, sigma2 / np.where(den > 0, den, 1.0), 1.0)  # (B,)
    return w, {"prior_weight": float(w.mean()) if w.size else 0.0}


def fused_baseline(r, mask=None, prior=None, prior_var: float = 0.01, leave_one_out: bool = False,
                   use_prior=None) -> tuple[np.ndarray, dict]:
    """Each rollout's baseline, (B, N) rewards with a (B, N) mask of the rollouts drawn -> (B, N).

    prior None (or use_prior False for a prompt): the empirical mean of the prompt's rollouts,
    GRPO's group mean; with leave_one_out, the mean of the other n - 1 (RLOO). Otherwise
    b = w v + (1 - w) m with w = ``fusion_weight(v, n', prior_var)``, where (m, n') = (mean of all n,
    n) or, left-one-out, (mean of the other n - 1, n - 1). Masked-out entries get baseline 0.

    >>> r = np.array([[1.0, 0.0, 0.0, 0.0]])
    >>> fused_baseline(r)[0].tolist()                     # group mean
    [[0.25, 0.25, 0.25, 0.25]]
    >>> fused_baseline(r, leave_one_out=True)[0].tolist()  # the other three
    [[0.0, 0.3333333333333333, 0.3333333333333333, 0.3333333333333333]]
    >>> fused_baseline(r, prior=[0.5], prior_var=0.0625)[0].tolist()  # w = 1/2: (0.5 + 0.25) / 2
    [[0.375, 0.375, 0.375, 0.375]]
    """
    r, mask, n, s = _counts(r, mask)
    B = r.shape[0]
    if prior is None:
        use = np.zeros(B, dtype=bool)
        v = np.full(B, 0.5)
    else:
        v = np.asarray(prior, dtype=np.float64)  # (B,)
        use = np.ones(B, dtype=bool) if use_prior is None else np.asarray(use_prior, dtype=bool)
    if leave_one_out:
        n_eff = np.broadcast_to((n - 1)[:, None], r.shape)  # (B, N) rollouts other than j
        if np.any((n_eff < 1) & mask & ~use[:, None]):
            raise ValueError("a leave-one-out group mean needs at least 2 rollouts per prompt")
        m = (s[:, None] - r) / np.maximum(n_eff, 1)  # (B, N)
    else:
        if np.any(n < 1):
            raise ValueError("every prompt needs at least one rollout")
        n_eff = np.broadcast_to(n[:, None], r.shape)  # (B, N)
        m = np.broadcast_to((s / n)[:, None], r.shape)  # (B, N)
    w, _ = fusion_weight(np.broadcast_to(v[:, None], r.shape), n_eff, prior_var)  # (B, N)
    w = np.where(use[:, None], w, 0.0)  # (B, N) a rejected (or absent) prior weighs 0
    b = np.where(mask, w * v[:, None] + (1.0 - w) * m, 0.0)  # (B, N)
    shares = w[mask]
    return b, {"prior_weight": float(shares.mean()) if shares.size else 0.0}


def prior_test(r, mask=None, prior=None, prior_var: float = 0.01, z_crit: float = 2.0,
               pooled: bool = False, groups=None) -> tuple[np.ndarray, dict]:
    """z_i = (m_i - v_i) / sqrt(v_i (1 - v_i) / n_i + tau^2) per prompt; reject where |z_i| > z_crit.
    With ``pooled``, also the round's pooled statistic
    z_pool = sum_i (m_i - v_i) / sqrt(sum_i (v_i (1 - v_i) / n_i + tau^2)) over the prompts of one
    round (``groups``: (B,) round ids, default one round), and every prompt of a round with
    |z_pool| > z_crit is rejected: a systematic bias that G = 4 rollouts of one prompt cannot show.
    (B, N), (B, N), (B,) -> ((B,) bool, metrics with ``z`` (B,), ``z_pool`` (B,), ``reject_rate``).

    >>> rej, m = prior_test(np.array([[1.0, 1, 1, 0], [0.0, 0, 0, 0]]), prior=[0.2, 0.2], prior_var=0.01)
    >>> rej.tolist(), m["z"].round(3).tolist()   # sd = sqrt(0.16/4 + 0.01) = 0.2236
    ([True, False], [2.46, -0.894])
    >>> prior_test(np.zeros((4, 4)), prior=[0.3] * 4, prior_var=0.01, pooled=True)[0].tolist()
    [True, True, True, True]
    """
    r, mask, n, s = _counts(r, mask)
    v = np.asarray(prior, dtype=np.float64)  # (B,)
    var = v * (1.0 - v) / np.maximum(n, 1) + prior_var  # (B,)
    d = s / np.maximum(n, 1) - v  # (B,)
    z = d / np.sqrt(np.maximum(var, 1e-24))  # (B,)
    reject = np.abs(z) > z_crit  # (B,)
    z_pool = np.zeros_like(z)
    if pooled and len(z):
        g = np.zeros(len(z), dtype=int) if groups is None else np.unique(groups, return_inverse=True)[1]
        num = np.bincount(g, weights=d)  # (R,)
        den = np.sqrt(np.maximum(np.bincount(g, weights=var), 1e-24))  # (R,)
        z_pool = (num / den)[g]  # (B,)
        reject |= np.abs(z_pool) > z_crit
    return reject, {"z": z, "z_pool": z_pool, "reject_rate": float(reject.mean()) if reject.size else 0.0}


def allocate_extra(r, mask=None, reject=None, mse_target: float = 0.02, max_extra: int = 8,
                   budget: int | None = None, groups=None) -> tuple[np.ndarray, dict]:
    """Extra rollouts per prompt, (B,) ints: for a rejected prompt the fewest k with
    sigmahat^2 / (n + k) <= mse_target, sigmahat^2 = q (1 - q), q = (s + 1) / (n + 2), capped at
    ``max_extra``. If a round's wishes (``groups``: (B,) round ids, default one round) sum past
    ``budget``, the round's rollouts go one at a time to the prompt whose sigmahat^2 / n would drop
    most, sigmahat^2 / n - sigmahat^2 / (n + 1) (ties: the first prompt), i.e. the ``budget``
    largest marginal gains.

    >>> allocate_extra(np.zeros((2, 4)), reject=[True, False], mse_target=0.02)[0].tolist()
    [3, 0]

    Gains of prompt 0 (q = 1/2): .0125, .0083, .0060, .0045; of prompt 1 (q = 1/6): .0069, .0046:
    >>> allocate_extra(np.array([[1.0, 1, 0, 0], [0, 0, 0, 0]]), reject=[True, True], budget=5)[0].tolist()
    [3, 2]
    """
    r, mask, n, s = _counts(r, mask)
    B = len(n)
    reject = np.zeros(B, dtype=bool) if reject is None else np.asarray(reject, dtype=bool)
    q = (s + 1.0) / (n + 2.0)
    sigma2 = q * (1.0 - q)  # (B,)
    want = np.ceil(sigma2 / mse_target - 1e-9) - n  # (B,)
    want = np.where(reject, np.clip(want, 0, max_extra), 0).astype(int)  # (B,)
    g = np.zeros(B, dtype=int) if groups is None else np.unique(groups, return_inverse=True)[1]
    if budget is not None and B and np.bincount(g, weights=want).max() > budget:
        K = int(want.max())
        k = np.arange(K)[None, :]  # (1, K) the k-th extra rollout of a prompt
        nn = n[:, None] + k  # (B, K)
        gain = sigma2[:, None] / nn - sigma2[:, None] / (nn + 1)  # (B, K), decreasing in k
        ok = (k < want[:, None]).ravel()
        rows = np.repeat(np.arange(B), K)[ok]
        order = np.lexsort((np.tile(np.arange(K), B)[ok], rows, -gain.ravel()[ok], g[rows]))
        rows_sorted, g_sorted = rows[order], g[rows][order]
        start = np.searchsorted(g_sorted, g_sorted, side="left")  # first slot of each round
        taken = rows_sorted[np.arange(len(order)) - start < budget]
        want = np.bincount(taken, minlength=B).astype(int)
    return want, {"extra": int(want.sum())}


def policy_gradient(r, mask, baseline, p) -> tuple[np.ndarray, dict]:
    """g_i = (1/n_i) sum_j mask_ij (r_ij - b_ij)(r_ij - p_i): REINFORCE on the logit of a Bernoulli
    prompt (score r - p), each prompt's rollouts averaged. (B, N) x3, (B,) -> ((B,), metrics).
    With a full mask and a shared baseline it is ``PromptBandit.policy_gradient``.
    """
    r, mask, n, _ = _counts(r, mask)
    p = np.asarray(p, dtype=np.float64)[:, None]  # (B, 1)
    adv = (r - np.asarray(baseline, dtype=np.float64)) * mask  # (B, N)
    g = (adv * (r - p)).sum(1) / np.maximum(n, 1)  # (B,)
    return g, {"zero_adv_frac": float(np.mean(np.all(np.abs(adv) < 1e-12, axis=1))) if len(g) else 0.0}


@dataclass
class Round:
    """One round's prompts, rollouts and baselines; ``rollouts`` counts every rollout drawn (DAPO's
    dropped groups and V0.5's extra rollouts included)."""

    idx: np.ndarray  # (B,) prompt indices whose rollouts enter the update
    r: np.ndarray  # (B, N) rewards
    mask: np.ndarray  # (B, N) the rollouts drawn
    baseline: np.ndarray  # (B, N)
    rollouts: int
    metrics: dict = field(default_factory=dict)


def sample_round(bandit, idx, cfg: V05Config, rng: np.random.Generator, groups=None) -> Round:
    """Draw the round's rollouts on a ``PromptBandit`` for the chosen prompts and build the
    baselines of ``cfg.estimator``. idx: (B,) prompt indices (DAPO draws more itself). ``groups``
    (B,): round ids when several rounds are drawn at once (``estimator_study``); the test's pooling
    and the extra budget (``extra_per_prompt`` times the prompts of a round) are per round."""
    idx = np.asarray(idx, dtype=int)
    G, B = cfg.group_size, len(idx)
    r = bandit.rewards(idx, G, rng)  # (B, G)
    spent = r.size
    metrics = {}
    if cfg.estimator in ("grpo", "dapo"):
        if cfg.estimator == "dapo":
            keep = ~all_equal(torch.from_numpy(r)).numpy()  # (B,)
            idx, r = idx[keep], r[keep]
            for _ in range(cfg.max_resample_rounds):
                if len(idx) >= B:
                    break
                more = rng.integers(0, len(bandit.theta), B - len(idx))
                r_more = bandit.rewards(more, G, rng)
                spent += r_more.size
                keep = ~all_equal(torch.from_numpy(r_more)).numpy()
                idx, r = np.concatenate([idx, more[keep]]), np.concatenate([r, r_more[keep]])
            metrics["kept_frac"] = len(idx) * G / spent
        mask = np.ones_like(r, dtype=bool)
        b, m = fused_baseline(r, mask, None, leave_one_out=cfg.leave_one_out) if len(r) else (r, {})
        return Round(idx, r, mask, b, spent, metrics)
    v = bandit.prior(idx, rng)  # (B,)
    mask = np.ones_like(r, dtype=bool)
    use = np.ones(B, dtype=bool)
    if cfg.estimator == "v05":
        reject, tm = prior_test(r, mask, v, cfg.prior_var, cfg.z_crit, cfg.pooled_test, groups)
        per_round = B if groups is None else int(np.bincount(np.unique(groups, return_inverse=True)[1]).max())
        k, am = allocate_extra(r, mask, reject, cfg.mse_target, cfg.max_extra,
                               int(math.floor(cfg.extra_per_prompt * per_round)), groups)
        N = G + int(k.max()) if B else G
        r_full = np.zeros((B, N))
        r_full[:, :G] = r
        mask = np.arange(N)[None, :] < (G + k)[:, None]  # (B, N)
        for i in np.flatnonzero(k):
            r_full[i, G:G + k[i]] = bandit.rewards(idx[i:i + 1], int(k[i]), rng)[0]
        r, spent = r_full, spent + int(k.sum())
        use = ~reject
        metrics.update(reject_rate=tm["reject_rate"], extra=am["extra"])
    b, bm = fused_baseline(r, mask, v, cfg.prior_var, cfg.leave_one_out, use)
    metrics["prior_weight"] = bm["prior_weight"]
    return Round(idx, r, mask, b, spent, metrics)


def train(bandit, cfg: V05Config, rng: np.random.Generator) -> dict:
    """Rounds of B prompts drawn uniformly without replacement, the estimator's baselines, one
    learner step each, until ``cfg.rollout_budget`` rollouts are spent. Returns lists per round:
    ``rollouts`` (cumulative, after the round), ``success`` (mean p over all prompts after the
    step), and the rounds' metrics (``reject_rate``, ``extra``, ``kept_frac``, ``prior_weight``),
    with ``rollouts[0] = 0`` and ``success[0]`` the start."""
    N = len(bandit.theta)
    out = {"rollouts": [0], "success": [float(bandit.p.mean())], "rounds": []}
    spent = 0
    bar = progress(total=cfg.rollout_budget, desc=f"v05 ({cfg.estimator})", unit="rollout")
    while spent < cfg.rollout_budget:
        idx = rng.choice(N, size=min(cfg.num_prompts, N), replace=False)
        rnd = sample_round(bandit, idx, cfg, rng)
        if len(rnd.idx):
            g, gm = policy_gradient(rnd.r, rnd.mask, rnd.baseline, bandit.p[rnd.idx])
            bandit.step(rnd.idx, g, cfg.lr)
            rnd.metrics["zero_adv_frac"] = gm["zero_adv_frac"]
        spent += rnd.rollouts
        bar.update(rnd.rollouts)
        out["rollouts"].append(spent)
        out["success"].append(float(bandit.p.mean()))
        out["rounds"].append(rnd.metrics)
    bar.close()
    return out


def curve_on_grid(rollouts, values, grid) -> np.ndarray:
    """The value after the last round that had spent at most x rollouts, for each x of ``grid``
    (equal-budget curves of arms whose rounds cost different numbers of rollouts).

    >>> curve_on_grid([0, 64, 160], [0.1, 0.2, 0.3], [0, 100, 160]).tolist()
    [0.1, 0.2, 0.3]
    """
    i = np.searchsorted(np.asarray(rollouts), np.asarray(grid), side="right") - 1
    return np.asarray(values, dtype=np.float64)[np.clip(i, 0, None)]


def estimator_study(bandit, cfg: V05Config, num_draws: int, rng: np.random.Generator) -> dict:
    """Statistics of the estimator at the frozen learner: every prompt, ``num_draws`` independent
    rounds (one tiled round; the extra budget scales with it). Returns

    - ``baseline_mse``: mean over prompts, draws and rollouts of (b_ij - p_i)^2;
    - ``grad_mse``: mean over prompts and draws of (g_i - p_i (1 - p_i))^2, the error against
      ``exact_gradient``; ``grad_var``: its variance part (around each prompt's mean g);
    - ``grad_ratio``: sum_i mean g_i / sum_i p_i (1 - p_i), 1 for an unbiased estimator, (G-1)/G
      for GRPO's group mean; ``grad_var_unit`` = grad_var / grad_ratio^2, the variance of the
      estimator rescaled to the exact gradient's size (a shrunk estimator is not less noisy);
    - ``rollouts_per_prompt``, ``reject_rate``.
    DAPO's estimator is GRPO's group mean on the groups it keeps: use 'grpo' here."""
    if cfg.estimator == "dapo":
        raise ValueError("estimator_study: DAPO's baseline is the group mean, study 'grpo'")
    N = len(bandit.theta)
    idx = np.tile(np.arange(N), num_draws)  # (D N,)
    rnd = sample_round(bandit, idx, cfg, rng, groups=np.arange(len(idx)) // min(cfg.num_prompts, N))
    p = bandit.p[idx]  # (D N,)
    g, _ = policy_gradient(rnd.r, rnd.mask, rnd.baseline, p)  # (D N,)
    exact = bandit.exact_gradient(np.arange(N))  # (N,)
    g_dn = g.reshape(num_draws, N)  # (D, N)
    err2 = ((rnd.baseline - p[:, None]) ** 2 * rnd.mask).sum(1) / rnd.mask.sum(1)  # (D N,)
    return {"baseline_mse": float(err2.mean()),
            "grad_mse": float(((g_dn - exact) ** 2).mean()),
            "grad_var": float(g_dn.var(0).mean()),
            "grad_ratio": float(g_dn.mean(0).sum() / exact.sum()),
            "grad_var_unit": float(g_dn.var(0).mean() / (g_dn.mean(0).sum() / exact.sum()) ** 2),
            "rollouts_per_prompt": rnd.rollouts / len(idx),
            "reject_rate": float(rnd.metrics.get("reject_rate", 0.0))}
