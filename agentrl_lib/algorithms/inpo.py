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
from agentrl_lib.rollout import model_device
from agentrl_lib.utils import optimizer_step, progress

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


def implicit_reward_agreement(pi, ref_probs, P, atol: float = 1e-9) -> float:
    """How far the judge agrees with the implicit reward r(y) = log pi(y)/pi_ref(y) (DPO's reward,
    up to its beta > 0, which leaves the ranking unchanged): over every unordered pair {i, j} of
    the K responses, P[i, j] when r ranks i above j, P[j, i] when below, 1/2 on a tie
    (|r_i - r_j| <= atol), averaged over the pairs (and over the S prompts when pi and ref_probs
    are (S, K)). 1/2 at pi = pi_ref (r = 0); a Bradley-Terry learner that has read the judge's
    labels raises it, whether or not it becomes less exploitable (on a cycle no ranking agrees
    on every pair). pi, ref_probs: (K,) or (S, K); P: (K, K)."""
    pi, ref = np.atleast_2d(np.asarray(pi, np.float64)), np.atleast_2d(np.asarray(ref_probs,
                                                                                  np.float64))
    P = np.asarray(P, np.float64)
    r = np.log(np.clip(pi, 1e-300, None)) - np.log(ref)  # (S, K)
    i, j = np.triu_indices(P.shape[0], 1)
    d = r[:, i] - r[:, j]  # (S, K(K-1)/2)
    agree = np.where(d > atol, P[i, j], np.where(d < -atol, P[j, i], 0.5))
    return float(agree.mean())


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
        optimizer_step(opt, loss)
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


# --- the language-model rung: a restricted response set -------------------------------------------
def lm_candidate_logps(model, tokenizer, prompts: list[str], candidates: list[list[str]]):
    """The LM's policy over a restricted response set: for prompt x_s with K candidates y_{s,k},

        log pi(y_{s,k} | x_s, set) = log pi(y_{s,k} | x_s) - log sum_k' pi(y_{s,k'} | x_s)

    (the sequence log-probs of ``dpo.lm_sequence_logps``, log-softmax over the set). prompts: S
    strings; candidates: S lists of K strings. Returns (S, K) log-probs, with gradients. Pairwise
    losses on differences log pi(y_w) - log pi(y_l) are the same on these as on the raw sequence
    log-probs (the normaliser cancels)."""
    from agentrl_lib.algorithms.dpo import lm_sequence_logps

    S = len(prompts)
    if S == 0 or len(candidates) != S or len({len(c) for c in candidates}) != 1:
        raise ValueError("candidates must hold one list of K strings per prompt (same K for all)")
    K = len(candidates[0])
    flat_p = [p for p, cs in zip(prompts, candidates) for _ in cs]
    flat_c = [c for cs in candidates for c in cs]
    seq = lm_sequence_logps(model, tokenizer, flat_p, flat_c).reshape(S, K)  # (S, K)
    return torch.log_softmax(seq, -1)  # (S, K)


def candidate_rounds(model, tokenizer, prompts: list[str], candidates: list[list[str]],
                     num_rounds: int, round_fn, with_grad: bool = False,
                     desc: str | None = None) -> np.ndarray:
    """The loop of both LM rungs over a restricted response set (INPO's self-play rounds, SPO's
    steps): before each of ``num_rounds`` rounds and after the last, the LM's policy over each
    prompt's candidates, log pi (S, K) (``lm_candidate_logps``; with gradients when
    ``with_grad``) and pi (S, K) in float64, renormalised; ``round_fn(t, logp, pi)`` makes round
    t's update (sampling, its optimizer steps, its own curves). Returns the num_rounds + 1
    policies pi_0..pi_T, (T+1, S, K)."""
    pis = []
    for t in progress(range(num_rounds + 1), desc=desc):
        with torch.set_grad_enabled(with_grad):
            logp = lm_candidate_logps(model, tokenizer, prompts, candidates).float()  # (S, K)
        pi = logp.detach().exp().double().cpu().numpy()
        pi /= pi.sum(-1, keepdims=True)
        pis.append(pi)
        if t < num_rounds:
            round_fn(t, logp, pi)
    return np.array(pis)


def lm_iterate(model, tokenizer, prompts: list[str], candidates: list[list[str]], bandit: PrefBandit,
               cfg: IterConfig, ref_logps=None, target=None) -> dict:
    """The self-play rounds of ``iterate`` with the LM as the policy over each prompt's K candidates
    (``lm_candidate_logps``): each round draws ``cfg.num_pairs`` pairs per prompt from the LM's
    current distribution (0: the exact population of pairs), labels them by ``bandit`` (the same P
    for every prompt), and takes ``cfg.inner_steps`` Adam steps at ``cfg.inner_lr`` on all the LM's
    parameters, minimising the mean over prompts of the round's weighted ``dpo_loss`` (pi_ref: the
    log-probs ``ref_logps`` (S, K), default the model's at the start; INPO's pi_t: the LM's at the
    round's start). Trains ``model`` in place. Returns per-round curves: ``exploitability`` (mean
    over prompts of ``exploitability(pi_s, P)``), ``tv`` to ``target`` (when given), ``pis``
    (T+1, S, K)."""
    rng = np.random.default_rng(cfg.seed)
    S = len(prompts)
    if ref_logps is None:
        with torch.no_grad():
            ref_logps = lm_candidate_logps(model, tokenizer, prompts, candidates)
    device = model_device(model)  # every tensor the loss touches lives there
    ref_logps = torch.as_tensor(ref_logps, device=device).detach().float()  # (S, K)

    def round_fn(t, prev, pi):  # prev: (S, K) pi_t, without gradients
        rows = []
        for s in range(S):
            if cfg.num_pairs > 0:
                c, r, w = sample_pairs(bandit, pi[s], cfg.num_pairs, rng)
            else:
                c, r, w = population_pairs(pi[s], bandit.P)
            rows.append((np.full(len(c), s), c, r, w / S))
        s_, c, r, w = (np.concatenate(x) for x in zip(*rows))
        if len(c) == 0:
            return
        s_, c, r = (torch.as_tensor(x, dtype=torch.long, device=device) for x in (s_, c, r))
        w = torch.as_tensor(w, dtype=torch.float32, device=device)
        kw = {}
        if cfg.loss_type == "inpo":
            kw = {"prev_chosen_logps": prev[s_, c], "prev_rejected_logps": prev[s_, r], "eta": cfg.eta}
        opt = torch.optim.Adam(model.parameters(), lr=cfg.inner_lr)
        for _ in range(cfg.inner_steps):
            logp = lm_candidate_logps(model, tokenizer, prompts, candidates)  # (S, K)
            losses, _ = dpo_loss(logp[s_, c], logp[s_, r], ref_logps[s_, c], ref_logps[s_, r],
                                 cfg.beta, cfg.loss_type, **kw)
            optimizer_step(opt, (w * losses).sum())

    pis = candidate_rounds(model, tokenizer, prompts, candidates, cfg.num_iters, round_fn,
                           desc="inpo")
    mean_over_prompts = lambda f: [float(np.mean([f(p) for p in pi])) for pi in pis]  # noqa: E731
    return {"exploitability": mean_over_prompts(lambda p: exploitability(p, bandit.P)),
            "tv": mean_over_prompts(lambda p: total_variation(p, target)) if target is not None
            else [], "pis": pis}
