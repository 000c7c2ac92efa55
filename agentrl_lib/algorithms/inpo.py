"""Iterative self-play preference optimisation on a response bandit: INPO against iterated
Bradley-Terry DPO, both through ``dpo.dpo_loss``.

Each iteration t draws preference pairs from the current policy pi_t, labels them with the
preference oracle P, and fits the next policy by minimising a pairwise loss, starting from pi_t:

- ``loss_type="sigmoid"``: iterated (online) DPO, the reference fixed at pi_ref (Xiong et al. 2024;
  Dong et al. 2024, the baseline of the INPO paper). It reads each round's labels through a
  Bradley-Terry model.
- ``loss_type="inpo"``: INPO (Zhang et al. 2024): the squared loss relative to the previous iterate
  pi_t and the reference, whose population minimiser is the mirror-descent step ``omd_update``.

The pairs are either sampled (``num_pairs`` > 0) or exact: every ordered pair (i, j), i != j,
weighted by pi_t(i) pi_t(j) P[i, j] (``population_pairs``), the expectation the sampled loss
estimates. The policy is a softmax table (K,) fitted by Adam for ``inner_steps`` full-batch steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from agentrl_lib.algorithms.dpo import dpo_loss
from agentrl_lib.envs.pref_bandit import PrefBandit, exploitability, total_variation

LOSS_TYPES = ("sigmoid", "inpo")


def omd_update(pi_t, ref_probs, P, beta: float, eta: float) -> np.ndarray:
    """One step of online mirror descent on the KL-regularised preference game (INPO's target):

        log pi_{t+1}(y) = (1 - eta beta) log pi_t(y) + eta beta log pi_ref(y) + eta (P pi_t)(y) + c

    Returns pi_{t+1} (K,)."""
    pi_t = np.asarray(pi_t, np.float64)
    z = ((1 - eta * beta) * np.log(pi_t) + eta * beta * np.log(np.asarray(ref_probs, np.float64))
         + eta * (np.asarray(P, np.float64) @ pi_t))
    z -= z.max()
    p = np.exp(z)
    return p / p.sum()


def population_pairs(pi_t, P) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every ordered pair (chosen i, rejected j), i != j, with weight pi_t(i) pi_t(j) P[i, j]
    (the probability that a draw of two responses from pi_t yields it), normalised to sum 1.
    Returns (chosen (K(K-1),), rejected (K(K-1),), weights (K(K-1),))."""
    pi_t = np.asarray(pi_t, np.float64)
    K = len(pi_t)
    i, j = np.nonzero(~np.eye(K, dtype=bool))
    w = pi_t[i] * pi_t[j] * np.asarray(P)[i, j]
    return i, j, w / w.sum()


def sample_pairs(bandit: PrefBandit, pi_t, num_pairs: int, rng) -> tuple[np.ndarray, np.ndarray,
                                                                        np.ndarray]:
    """``num_pairs`` pairs y, y' ~ pi_t labelled by the bandit; identical pairs are dropped (they
    carry no preference). Returns (chosen, rejected, weights uniform)."""
    K = bandit.K
    y1, y2 = rng.choice(K, size=num_pairs, p=pi_t), rng.choice(K, size=num_pairs, p=pi_t)
    keep = y1 != y2
    y1, y2 = y1[keep], y2[keep]
    lab = bandit.compare(y1, y2, rng)
    c, r = np.where(lab > 0, y1, y2), np.where(lab > 0, y2, y1)
    return c, r, np.full(len(c), 1.0 / max(1, len(c)))


def fit_round(theta_t, ref_probs, chosen, rejected, weights, loss_type: str, beta: float,
              eta: float, inner_steps: int, inner_lr: float) -> tuple[np.ndarray, dict]:
    """Minimise sum_k weights_k dpo_loss_k over softmax logits (K,) from ``theta_t`` (pi_t) by Adam.
    Returns (new logits, metrics of the last step)."""
    theta = torch.tensor(np.asarray(theta_t, np.float64), requires_grad=True)
    c, r = torch.as_tensor(chosen, dtype=torch.long), torch.as_tensor(rejected, dtype=torch.long)
    w = torch.as_tensor(weights, dtype=torch.float64)
    logp_ref = torch.log(torch.as_tensor(ref_probs, dtype=torch.float64))  # (K,)
    logp_prev = torch.log_softmax(theta.detach().clone(), 0)  # (K,) pi_t
    kw = {}
    if loss_type == "inpo":
        kw = {"prev_chosen_logps": logp_prev[c], "prev_rejected_logps": logp_prev[r], "eta": eta}
    opt = torch.optim.Adam([theta], lr=inner_lr)
    metrics = {}
    for _ in range(inner_steps):
        logp = torch.log_softmax(theta, 0)  # (K,)
        losses, metrics = dpo_loss(logp[c], logp[r], logp_ref[c], logp_ref[r], beta, loss_type, **kw)
        loss = (w * losses).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    metrics["losses/pref"] = float(loss.item())
    return theta.detach().numpy().copy(), metrics


@dataclass
class IterConfig:
    loss_type: str = "inpo"
    """'sigmoid' (iterated Bradley-Terry DPO) or 'inpo'"""
    num_iters: int = 40
    """self-play rounds t = 0..T-1"""
    num_pairs: int = 0
    """preference pairs drawn from pi_t per round; 0: the exact population of pairs"""
    beta: float = 0.05
    """KL weight toward pi_ref (DPO's beta; INPO's tau)"""
    eta: float = 2.0
    """INPO's mirror-descent step (unused by DPO)"""
    inner_steps: int = 200
    """Adam steps per round"""
    inner_lr: float = 0.1
    """Adam learning rate per round"""
    seed: int = 0

    def __post_init__(self):
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"unknown loss_type {self.loss_type!r}; expected one of {list(LOSS_TYPES)}")


def iterate(bandit: PrefBandit, cfg: IterConfig, ref_probs, target=None) -> dict:
    """Run the self-play rounds from pi_0 = pi_ref. Returns per-round curves (the policy before
    each round, and after the last): ``exploitability``, ``tv`` to ``target`` (when given), the
    policies ``pis`` (T+1, K) and the last round's ``metrics``."""
    rng = np.random.default_rng(cfg.seed)
    ref = np.asarray(ref_probs, np.float64)
    theta = np.log(ref).copy()
    out = {"exploitability": [], "tv": [], "pis": []}
    metrics = {}
    for t in range(cfg.num_iters + 1):
        pi = np.exp(theta - theta.max())
        pi /= pi.sum()
        out["pis"].append(pi)
        out["exploitability"].append(exploitability(pi, bandit.P))
        if target is not None:
            out["tv"].append(total_variation(pi, target))
        if t == cfg.num_iters:
            break
        if cfg.num_pairs > 0:
            c, r, w = sample_pairs(bandit, pi, cfg.num_pairs, rng)
        else:
            c, r, w = population_pairs(pi, bandit.P)
        if len(c) == 0:
            continue
        theta, metrics = fit_round(theta, ref, c, r, w, cfg.loss_type, cfg.beta, cfg.eta,
                                   cfg.inner_steps, cfg.inner_lr)
    out["pis"] = np.array(out["pis"])
    out["metrics"] = metrics
    return out
