"""EMPG: Entropy-Modulated Policy Gradients (Wang et al. 2025, "Harnessing Uncertainty:
Entropy-Modulated Policy Gradients for Long-Horizon LLM Agents", arXiv:2509.09265).

**The coupling.** For a softmax policy pi = softmax(z), the score of action a is
d log pi(a) / dz = e_a - pi, so its expected squared norm under pi is

    E_{a~pi} ||e_a - pi||^2 = 1 - sum_a pi_a^2 = 1 - exp(-H_2(pi)),

with H_2 = -log sum_a pi_a^2 the Renyi-2 (collision) entropy (``expected_score_norm_sq``,
``renyi2_entropy``). Confident steps (low entropy) give small gradients, uncertain ones large: a
policy gradient spends its update where the policy is unsure, and barely moves the steps it is
sure of, right or wrong.

**The modulation.** Per step t of episode i, with H_t the policy's entropy at that step (for an LM:
the mean token entropy over the step's action tokens), EMPG replaces the trajectory advantage A_i
(GRPO's: the return normalised in its group) by

    H~_t     = (H_t - min_batch H) / (max_batch H - min_batch H + eps_h)     (batch min-max)
    g(H~_t)  = exp(-k H~_t) / mean_batch exp(-k H~)                          (mean 1 over the batch)
    f(H~_t+1) = zeta * exp(-k' H~_{t+1})     (0 at an episode's last step)   (future clarity)
    A^mod_t  = g(H~_t) A_i + f(H~_{t+1})
    A_t      = A^mod_t - mean_batch A^mod                                    (final centring, eq. 7)

g > 1 on confident steps (their signal is amplified: a confident correct step is reinforced more,
a confident error in a failed episode penalised more) and g < 1 on uncertain ones (attenuated);
self-calibrated so that the batch's average scale is unchanged. The clarity bonus rewards a step
whose *next* state the policy is sure about, whatever the outcome.

Taken from the paper's pseudocode (its project page, empgseed-seed.github.io,
``compute_empg_advantage``; the part after the ``f_H`` tensors read in verbatim copies of it in
two third-party verl ``core_algos.py``; the authors released no repository): the step entropy as
the mean token entropy of the step, the batch min-max normalisation with eps_h = 1e-8 (eq. 12),
g = exp(-k H~) divided by its batch mean (eq. 10), the bonus zeta exp(-k' H~_{t+1}) of the same
episode's next step, 0 at its last step (eq. 11), and the final step "Final Advantage
Normalization (Eq. 7)": ``advantages -= mean(step_advantages)``, a centring over the batch's steps
with no division by a std (``final_norm='center'``); the defaults k = k' = 1, zeta = 0.1.
Inferred: the base advantage = GRPO's group-normalised undiscounted return
(``credit.episode_advantages``; the pseudocode modulates the trainer's precomputed advantage). The
pseudocode adds 1e-8 to g's denominator; we do not (a relative 1e-8). Named variants of ours:
``final_norm='batch'`` (also divide by the batch std, ddof and eps as ``credit.py``: this
library's form before issue 27, which puts every update at unit scale) and ``'none'``;
``bonus='linear'`` (f = -zeta H~_{t+1}, the plain "-H_{t+1}" form).

Arena use: ``empg_advantages(episodes, entropies)`` with ``entropies`` a list of (T_i,) arrays,
e.g. ``split_turns(policy.episode_entropies(episodes), episodes)`` for a ``KeyTablePolicy``.
For the LM loop, ``lm_turn_entropies(model, episodes)`` gives the per-turn mean token entropies and
``lm_credit(model, **kw)`` a ``credit_fn`` for ``grpo.train``.
"""

from __future__ import annotations

import numpy as np

from agentrl_lib.algorithms import credit

VARIANTS_BONUS = ("exp", "linear", "none")
VARIANTS_FINAL = ("center", "batch", "none")  # the pseudocode's eq. 7 first


def expected_score_norm_sq(logits) -> np.ndarray:
    """E_{a~pi} ||d log pi(a)/dz||^2 = 1 - sum_a pi_a^2 for pi = softmax(z); (..., A) -> (...)."""
    z = np.asarray(logits, dtype=np.float64)
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)  # (..., A)
    return 1.0 - (p ** 2).sum(-1)


def renyi2_entropy(probs) -> np.ndarray:
    """H_2(pi) = -log sum_a pi_a^2 (collision entropy, <= Shannon's); (..., A) -> (...)."""
    p = np.asarray(probs, dtype=np.float64)
    return -np.log((p ** 2).sum(-1))


def shannon_entropy(probs) -> np.ndarray:
    """H(pi) = -sum_a pi_a log pi_a (0 log 0 = 0); (..., A) -> (...)."""
    p = np.asarray(probs, dtype=np.float64)
    return -np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0).sum(-1)


def split_turns(values, episodes) -> list[np.ndarray]:
    """Cut a flat (sum_i T_i,) array/tensor of per-turn values (e.g.
    ``KeyTablePolicy.episode_entropies(episodes)``) into one (T_i,) float64 array per episode."""
    flat = values.detach().cpu().numpy() if hasattr(values, "detach") else np.asarray(values)
    flat = np.asarray(flat, dtype=np.float64).reshape(-1)
    lengths = [len(ep) for ep in episodes]
    if flat.shape[0] != sum(lengths):
        raise ValueError(f"split_turns: {flat.shape[0]} values for {sum(lengths)} turns")
    return list(np.split(flat, np.cumsum(lengths)[:-1])) if lengths else []


def normalise_entropies(entropies, eps_h: float = 1e-8) -> list[np.ndarray]:
    """Batch min-max normalisation H~ = (H - min H) / (max H - min H + eps_h), in [0, 1)
    (all 0 when every step has the same entropy); per episode (T_i,)."""
    flat = np.concatenate([np.asarray(h, dtype=np.float64) for h in entropies]) if entropies else \
        np.zeros(0)
    if flat.size == 0:
        return [np.zeros(0) for _ in entropies]
    lo, hi = flat.min(), flat.max()
    return [(np.asarray(h, dtype=np.float64) - lo) / (hi - lo + eps_h) for h in entropies]


def modulation(h_norm, k: float = 1.0) -> list[np.ndarray]:
    """g(H~_t) = exp(-k H~_t) / mean over the batch's steps of exp(-k H~): mean 1; per episode."""
    raw = [np.exp(-k * np.asarray(h, dtype=np.float64)) for h in h_norm]
    flat = np.concatenate(raw) if raw else np.zeros(0)
    if flat.size == 0:
        return raw
    return [r / flat.mean() for r in raw]


def clarity_bonus(h_norm, zeta: float = 0.1, k_prime: float = 1.0,
                  bonus: str = "exp") -> list[np.ndarray]:
    """f(H~_{t+1}) of every step t, 0 at an episode's last step; per episode (T_i,).
    'exp': zeta * exp(-k' H~_{t+1}) (the paper's); 'linear': -zeta * H~_{t+1}; 'none': 0."""
    if bonus not in VARIANTS_BONUS:
        raise ValueError(f"bonus must be one of {VARIANTS_BONUS}, got {bonus!r}")
    out = []
    for h in h_norm:
        h = np.asarray(h, dtype=np.float64)
        f = np.zeros(len(h))
        if bonus == "exp":
            f[:-1] = zeta * np.exp(-k_prime * h[1:])
        elif bonus == "linear":
            f[:-1] = -zeta * h[1:]
        out.append(f)
    return out


def empg_advantages(episodes, entropies, k: float = 1.0, k_prime: float = 1.0, zeta: float = 0.1,
                    gamma: float = 1.0, norm_adv: bool = True, ddof: int = 1, eps: float = 1e-4,
                    eps_h: float = 1e-8, bonus: str = "exp", final_norm: str = "center",
                    base_advantages=None) -> list[np.ndarray]:
    """EMPG's per-turn advantages (module docstring):
    A^mod_t = g(H~_t) A_i + f(H~_{t+1}), then the final step over the batch's turns:
    'center' (the pseudocode's eq. 7): A^mod - mean; 'batch' (ours): (A^mod - mean) / (std(ddof)
    + eps); 'none': A^mod.

    episodes: the batch (groups are ``ep.group_id``). entropies: one (T_i,) array per episode, the
    policy's entropy at each turn (non-negative). A_i is GRPO's advantage of the episode's return
    discounted by ``gamma`` (1: the outcome), ``credit.episode_advantages`` with norm_adv, ddof and
    eps; ``base_advantages`` (one (T_i,) array per episode) replaces it, e.g. GiGPO's per-turn
    advantage. With k = 0, zeta = 0 and final_norm = 'none' this is exactly the base advantage.
    Returns one float64 array (T_i,) per episode.
    """
    if final_norm not in VARIANTS_FINAL:
        raise ValueError(f"final_norm must be one of {VARIANTS_FINAL}, got {final_norm!r}")
    if bonus not in VARIANTS_BONUS:
        raise ValueError(f"bonus must be one of {VARIANTS_BONUS}, got {bonus!r}")
    if len(entropies) != len(episodes):
        raise ValueError(f"empg_advantages: {len(entropies)} entropy arrays for "
                         f"{len(episodes)} episodes")
    ents = [np.asarray(h, dtype=np.float64).reshape(-1) for h in entropies]
    for i, (ep, h) in enumerate(zip(episodes, ents)):
        if len(h) != len(ep):
            raise ValueError(f"empg_advantages: episode {i} has {len(ep)} turns but "
                             f"{len(h)} entropies")
        if np.any(h < -1e-9) or not np.all(np.isfinite(h)):
            raise ValueError(f"empg_advantages: episode {i} has a negative or non-finite entropy")
    if not episodes:
        return []
    if base_advantages is None:
        a_ep = credit.episode_advantages(episodes, gamma, norm_adv, ddof, eps)  # (B,)
        base = [np.full(len(ep), a) for ep, a in zip(episodes, a_ep)]
    else:
        base = [np.asarray(a, dtype=np.float64).reshape(-1) for a in base_advantages]
        if [len(a) for a in base] != [len(ep) for ep in episodes]:
            raise ValueError("empg_advantages: base_advantages must have one value per turn")
    h_norm = normalise_entropies(ents, eps_h)
    g = modulation(h_norm, k)
    f = clarity_bonus(h_norm, zeta, k_prime, bonus)
    mod = [gi * ai + fi for gi, ai, fi in zip(g, base, f)]  # (T_i,) each
    if final_norm == "none":
        return mod
    flat = np.concatenate(mod)
    if flat.size < 2 or np.all(flat == flat[0]):  # no spread: exactly 0 (not a rounding error)
        return [np.zeros(len(m)) for m in mod]
    mu = flat.mean()
    if final_norm == "center":  # eq. 7: advantages -= mean(step_advantages)
        return [m - mu for m in mod]
    sd = flat.std(ddof=ddof)
    return [(m - mu) / (sd + eps) for m in mod]


def table_credit(policy, **kwargs):
    """An ``agent_pg.train(credit_fn=...)`` for a policy with ``episode_entropies``
    (``KeyTablePolicy``): the sampling policy's turn entropies, then ``empg_advantages``."""
    import torch

    def credit_fn(episodes):
        with torch.no_grad():
            ents = split_turns(policy.episode_entropies(episodes), episodes)
        return empg_advantages(episodes, ents, **kwargs)
    return credit_fn


def lm_turn_entropies(model, episodes, batch_size: int = 8) -> list[np.ndarray]:
    """H_t of an LM agent: the mean over turn t's action tokens of the next-token entropy
    -sum_v p(v) log p(v) of ``model`` given the conversation so far (``rollout.episode_logps``'s
    entropies, aligned with ``token_ids``), one (T_i,) array per episode, no gradient. Needs
    token-level episodes (``turn_spans``)."""
    import torch

    from agentrl_lib.rollout import episode_logps
    for ep in episodes:
        if ep.turn_spans is None:
            raise ValueError("lm_turn_entropies needs token-level episodes (turn_spans is None)")
    out = []
    with torch.no_grad():
        for start in range(0, len(episodes), batch_size):
            chunk = episodes[start:start + batch_size]
            _, ents, _ = episode_logps(model, chunk)  # (B, N)
            ents = ents.float().cpu().numpy()
            for b, ep in enumerate(chunk):
                out.append(np.array([float(ents[b, s:e].mean()) if e > s else 0.0
                                     for s, e in ep.turn_spans], dtype=np.float64))
    return out


def lm_credit(model, **kwargs):
    """A ``grpo.train(credit_fn=...)`` for EMPG: the current model's turn entropies
    (``lm_turn_entropies``), then ``empg_advantages(episodes, entropies, **kwargs)``. ``metrics``
    holds the last call's mean turn entropy and modulation spread (logged by the loop)."""
    def credit_fn(episodes):
        ents = lm_turn_entropies(model, episodes)
        flat = np.concatenate(ents) if ents else np.zeros(0)
        g = np.concatenate(modulation(normalise_entropies(ents), kwargs.get("k", 1.0))) \
            if flat.size else flat
        credit_fn.metrics = {"empg/turn_entropy": float(flat.mean()) if flat.size else 0.0,
                             "empg/g_std": float(g.std()) if g.size else 0.0}
        return empg_advantages(episodes, ents, **kwargs)
    credit_fn.metrics = {}
    return credit_fn
