"""Direct preference optimisation: the pairwise losses on sequence log-probs, and one small loop.

**From the RLHF objective to the loss.** Maximising E_{y ~ pi}[r(x, y)] - beta KL(pi || pi_ref)
has the closed-form optimum pi*(y|x) = pi_ref(y|x) exp(r(x, y) / beta) / Z(x), so any reward is
r(x, y) = beta log pi*(y|x) / pi_ref(y|x) + beta log Z(x). Under Bradley-Terry,
Pr(y_w > y_l) = sigma(r_w - r_l): Z cancels, and the likelihood of the preferences becomes a loss on
the policy itself (Rafailov et al. 2023, eq. 7)::

    h = (log pi(y_w) - log pi_ref(y_w)) - (log pi(y_l) - log pi_ref(y_l))    # the log-ratio margin
    sigmoid (DPO):  -(1 - eps) log sigma(beta h) - eps log sigma(-beta h)     # eps = label_smoothing
    ipo (Azar et al. 2023, eq. 17):  (h / n - 1 / (2 beta))^2
    inpo (Zhang et al. 2024):  (h_t - eta / 2)^2, with the previous iterate pi_t (below)

**INPO** (iterative Nash policy optimisation) plays the preference game against itself by online
mirror descent with KL regularisation tau = ``beta`` toward pi_ref and step size ``eta``:
pi_{t+1}(y) ∝ pi_t(y)^(1 - eta tau) pi_ref(y)^(eta tau) exp(eta Pr(y > pi_t)). On pairs drawn from
pi_t and labelled by the preference oracle, the squared loss (h_t - eta/2)^2 with

    h_t = log pi(y_w)/pi(y_l) - eta tau log pi_ref(y_w)/pi_ref(y_l) - (1 - eta tau) log pi_t(y_w)/pi_t(y_l)

has that update as its population minimiser (the win rates Pr(y > pi_t) are never estimated).
It takes ``prev_chosen_logps``, ``prev_rejected_logps`` (pi_t's, (B,)) and ``eta``; the form is our
reading of the paper's loss (``notebooks/29_inpo.ipynb`` checks the minimiser numerically).

``beta * (log pi - log pi_ref)`` is DPO's implicit reward (the metrics ``rewards/*``). ``ipo``
divides each log-ratio by its completion length (``chosen_lengths``, ``rejected_lengths``; 1 when
not given), as TRL 1.16 does ("confirmed with the IPO authors" in its source). With
``label_smoothing=0`` both equal TRL 1.16 ``DPOTrainer``'s loss on the same log-probs
(``tests/test_dpo.py`` calls TRL's own loss code). ``label_smoothing`` is the conservative DPO of
Mitchell (2023) (a preference flipped with probability eps), as TRL < 1.0 had it.

**The loop.** ``train`` is one loop for any policy whose pair log-probs are a differentiable function
of its parameters: ``pair_logps(idx) -> (chosen_logps (b,), rejected_logps (b,))``. A tabular
softmax policy over K responses (``tabular_pair_logps``) and the tiny LM (``lm_pair_logps``: the
sum of the completion tokens' log-probs, as TRL) are the two the notebooks use. The reference
log-probs are computed once before training (TRL's ``precompute_ref_log_probs``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from agentrl_lib.utils import fit_pairs

Tensor = torch.Tensor

LOSS_TYPES = ("sigmoid", "ipo", "inpo")


def dpo_loss(chosen_logps: Tensor, rejected_logps: Tensor, ref_chosen_logps: Tensor,
             ref_rejected_logps: Tensor, beta: float = 0.1, loss_type: str = "sigmoid",
             label_smoothing: float = 0.0, **variant_kwargs) -> tuple[Tensor, dict]:
    """Per-pair preference losses (B,) from sequence log-probs (B,) each (see the module docstring
    for the equations). Variant keyword arguments: ``ipo`` takes ``chosen_lengths`` and
    ``rejected_lengths`` (B,) to length-normalise the log-ratios (TRL's convention); ``inpo`` takes
    ``prev_chosen_logps``, ``prev_rejected_logps`` (B,) (the previous iterate's) and ``eta`` (the
    mirror-descent step; ``beta`` is the KL weight tau, eta * beta <= 1).

    Returns (losses (B,), metrics): ``rewards/chosen``, ``rewards/rejected`` (mean implicit rewards
    beta * log-ratio), ``rewards/margins`` (their mean difference) and ``rewards/accuracies`` (the
    fraction of pairs whose chosen implicit reward is higher), as TRL logs them.

    >>> z = torch.zeros(2)
    >>> losses, m = dpo_loss(z, z, z, z, beta=0.1)
    >>> round(losses[0].item(), 4)  # log 2 at the reference
    0.6931
    """
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    chosen_logratios = chosen_logps - ref_chosen_logps  # (B,)
    rejected_logratios = rejected_logps - ref_rejected_logps  # (B,)
    h = chosen_logratios - rejected_logratios  # (B,)
    if loss_type == "sigmoid":
        _no_extra(loss_type, variant_kwargs)
        losses = (-(1 - label_smoothing) * F.logsigmoid(beta * h)
                  - label_smoothing * F.logsigmoid(-beta * h))  # (B,)
    elif loss_type == "ipo":
        extra = set(variant_kwargs) - {"chosen_lengths", "rejected_lengths"}
        if extra:
            raise ValueError(f"loss_type 'ipo' takes chosen_lengths and rejected_lengths, "
                             f"got unknown {sorted(extra)}")
        n_c = variant_kwargs.get("chosen_lengths")
        n_r = variant_kwargs.get("rejected_lengths")
        n_c = 1.0 if n_c is None else torch.as_tensor(n_c, dtype=h.dtype).clamp(min=1.0)
        n_r = 1.0 if n_r is None else torch.as_tensor(n_r, dtype=h.dtype).clamp(min=1.0)
        losses = (chosen_logratios / n_c - rejected_logratios / n_r - 1 / (2 * beta)) ** 2  # (B,)
    elif loss_type == "inpo":
        extra = set(variant_kwargs) - {"prev_chosen_logps", "prev_rejected_logps", "eta"}
        missing = {"prev_chosen_logps", "prev_rejected_logps", "eta"} - set(variant_kwargs)
        if extra or missing:
            raise ValueError(f"loss_type 'inpo' takes prev_chosen_logps, prev_rejected_logps and eta; "
                             f"unknown {sorted(extra)}, missing {sorted(missing)}")
        eta = float(variant_kwargs["eta"])
        if eta <= 0 or eta * beta > 1:
            raise ValueError(f"inpo needs eta > 0 and eta * beta <= 1, got eta={eta}, beta={beta}")
        prev_logratio = variant_kwargs["prev_chosen_logps"] - variant_kwargs["prev_rejected_logps"]
        h_t = ((chosen_logps - rejected_logps)
               - eta * beta * (ref_chosen_logps - ref_rejected_logps)
               - (1 - eta * beta) * prev_logratio)  # (B,)
        losses = (h_t - eta / 2) ** 2  # (B,)
    else:
        raise ValueError(f"unknown loss_type {loss_type!r}; expected one of {list(LOSS_TYPES)}")
    with torch.no_grad():
        r_c, r_r = beta * chosen_logratios, beta * rejected_logratios  # (B,) implicit rewards
        metrics = {"rewards/chosen": r_c.mean().item(), "rewards/rejected": r_r.mean().item(),
                   "rewards/margins": (r_c - r_r).mean().item(),
                   "rewards/accuracies": (r_c > r_r).float().mean().item()}
    return losses, metrics


def _no_extra(loss_type: str, kwargs: dict) -> None:
    if kwargs:
        raise ValueError(f"loss_type {loss_type!r} takes no extra arguments, got {sorted(kwargs)}")


def kl_optimal_policy(ref_probs, rewards, beta: float) -> np.ndarray:
    """The maximiser of E_pi[r] - beta KL(pi || pi_ref) over one prompt's responses (K,):
    pi*(y) = pi_ref(y) exp(r(y) / beta) / Z (Rafailov et al. 2023, eq. 4)."""
    logits = np.log(np.asarray(ref_probs, dtype=np.float64)) + np.asarray(rewards, np.float64) / beta
    logits -= logits.max()
    p = np.exp(logits)
    return p / p.sum()


# --- the loop --------------------------------------------------------------------------------------
@dataclass
class DPOConfig:
    loss_type: str = "sigmoid"
    """'sigmoid' (DPO), 'ipo' or 'inpo' (see ``dpo_loss``)"""
    beta: float = 0.1
    """KL weight of the RLHF objective; the implicit reward's scale"""
    lr: float = 1e-2
    """AdamW learning rate, constant (no warm-up), as TRL with lr_scheduler_type='constant'"""
    num_epochs: int = 10
    """passes over the pairs"""
    batch_size: int = 16
    """pairs per optimizer step (the last batch of an epoch may be smaller)"""
    label_smoothing: float = 0.0
    """conservative DPO's flip probability (sigmoid only)"""
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    """gradient-norm clip (TRL's default 1.0); 0 turns it off"""
    shuffle: bool = True
    """shuffle the pairs each epoch (seeded); False keeps their order"""
    seed: int = 0

    def __post_init__(self):
        if self.loss_type not in LOSS_TYPES:
            raise ValueError(f"unknown loss_type {self.loss_type!r}; expected one of "
                             f"{list(LOSS_TYPES)}")
        if self.batch_size < 1 or self.num_epochs < 0:
            raise ValueError("batch_size must be >= 1 and num_epochs >= 0")


def train(parameters, pair_logps, num_pairs: int, cfg: DPOConfig, ref_chosen_logps: Tensor,
          ref_rejected_logps: Tensor, evaluate=None, extra_loss=None, **variant_kwargs) -> list[dict]:
    """Minimise the mean ``dpo_loss`` over ``num_pairs`` pairs with AdamW (constant ``cfg.lr``).

    pair_logps(idx (b,) long tensor) -> (chosen_logps (b,), rejected_logps (b,)) with gradients;
    ref_*_logps: (N,) fixed reference log-probs. ``evaluate()`` -> dict is logged after every
    epoch (and before the first); ``extra_loss(idx)`` -> scalar tensor is added to the loss (e.g. a
    rationale term). Per-pair variant tensors in ``variant_kwargs`` ((N,) each, e.g. ipo's lengths)
    are indexed with the batch. Returns one record per optimizer step: ``step``, ``epoch``,
    ``losses/dpo``, the ``rewards/*`` metrics and, at epoch ends, ``eval/*``.
    """
    def pair_loss(idx: Tensor):
        chosen, rejected = pair_logps(idx)  # (b,) each
        kw = {k: (v[idx] if torch.is_tensor(v) else v) for k, v in variant_kwargs.items()}
        losses, metrics = dpo_loss(chosen, rejected, ref_chosen_logps[idx],
                                   ref_rejected_logps[idx], cfg.beta, cfg.loss_type,
                                   cfg.label_smoothing, **kw)
        loss = losses.mean()
        rec = {"losses/dpo": loss.item()}
        if extra_loss is not None:
            extra = extra_loss(idx)
            rec["losses/extra"] = extra.item()
            loss = loss + extra
        return loss, {**rec, **metrics}
    return fit_pairs(parameters, pair_loss, num_pairs, cfg.lr, cfg.num_epochs, cfg.batch_size,
                     cfg.seed, cfg.weight_decay, cfg.max_grad_norm, cfg.shuffle, evaluate,
                     desc="dpo epochs")


# --- pair log-probs of two kinds of policy ---------------------------------------------------------
def tabular_pair_logps(logits: Tensor, chosen: Tensor, rejected: Tensor):
    """``pair_logps`` of a softmax policy over K responses with (K,) ``logits`` (one prompt) or
    (S, K) logits with per-pair prompt indices: chosen/rejected are (N,) response indices, or
    (N, 2) [prompt, response] rows."""
    def pair_logps(idx: Tensor):
        logp = torch.log_softmax(logits, -1)  # (K,) or (S, K)
        if logp.dim() == 1:
            return logp[chosen[idx]], logp[rejected[idx]]
        c, r = chosen[idx], rejected[idx]  # (b, 2)
        return logp[c[:, 0], c[:, 1]], logp[r[:, 0], r[:, 1]]
    return pair_logps


def lm_sequence_logps(model, tokenizer, prompts: list[str], completions: list[str]) -> Tensor:
    """Sum of log pi(completion tokens + end-of-turn | chat(prompt)) per pair, (B,), with
    gradients: the sequence log-prob DPO uses (TRL sums over the completion tokens too)."""
    from agentrl_lib.rollout import chat_example, example_logps

    ex = [chat_example(tokenizer, p, c) for p, c in zip(prompts, completions)]
    logp, mask = example_logps(model, ex, tokenizer.pad_token_id)  # (B, L-1) each
    return (logp * mask).sum(-1)  # (B,)


def lm_pair_logps(model, tokenizer, prompts: list[str], chosen: list[str], rejected: list[str]):
    """``pair_logps`` of the tiny LM over (prompt, chosen, rejected) text triples."""
    def pair_logps(idx: Tensor):
        i = idx.tolist()
        c = lm_sequence_logps(model, tokenizer, [prompts[k] for k in i], [chosen[k] for k in i])
        r = lm_sequence_logps(model, tokenizer, [prompts[k] for k in i], [rejected[k] for k in i])
        return c, r
    return pair_logps


@torch.no_grad()
def reference_logps(pair_logps, num_pairs: int, batch_size: int = 64) -> tuple[Tensor, Tensor]:
    """The reference's (chosen, rejected) log-probs, (N,) each, without gradients."""
    cs, rs = [], []
    for s in range(0, num_pairs, batch_size):
        c, r = pair_logps(torch.arange(s, min(num_pairs, s + batch_size), device="cpu"))
        cs.append(c.detach().clone())
        rs.append(r.detach().clone())
    return torch.cat(cs), torch.cat(rs)


def implicit_reward(logps: Tensor, ref_logps: Tensor, beta: float) -> Tensor:
    """DPO's implicit reward beta * (log pi - log pi_ref), same shape as the inputs."""
    return beta * (logps - ref_logps)


def preference_probability(h: float, beta: float) -> float:
    """sigma(beta h): the Bradley-Terry probability the implicit rewards assign to a pair."""
    return 1.0 / (1.0 + math.exp(-beta * h))


# --- rationales (Just et al. 2024) -----------------------------------------------------------------
def rationale_nll(rationale_logits: Tensor, rationale: Tensor, gamma: float = 1.0) -> tuple[Tensor, dict]:
    """The rationale-likelihood term of rationale-augmented DPO, per pair: -gamma log p(rationale),
    with p = softmax(rationale_logits) over the A possible rationales.

    rationale_logits: (B, A) the policy's scores of each rationale for the pair (an LM scores the
    rationale's text given prompt and pair; a feature policy, each attribute's contribution to its
    implicit-reward margin); rationale: (B,) the index of the given rationale. RDPO minimises
    ``dpo_loss + rationale_nll`` (the form is inferred from the paper's description: the DPO loss
    plus a weighted likelihood of the rationale given the prompt and the pair).
    Returns (losses (B,), metrics ``rationale/accuracy``: the fraction whose top-scored rationale is
    the given one).

    >>> losses, _ = rationale_nll(torch.tensor([[1.0, 1.0]]), torch.tensor([0]))
    >>> round(losses.item(), 4)  # log 2
    0.6931
    """
    if rationale_logits.dim() != 2 or rationale.shape != rationale_logits.shape[:1]:
        raise ValueError(f"rationale_logits must be (B, A) and rationale (B,), got "
                         f"{tuple(rationale_logits.shape)} and {tuple(rationale.shape)}")
    logp = torch.log_softmax(rationale_logits, -1)  # (B, A)
    losses = -gamma * logp.gather(-1, rationale[:, None]).squeeze(-1)  # (B,)
    with torch.no_grad():
        acc = (rationale_logits.argmax(-1) == rationale).float().mean().item()
    return losses, {"rationale/accuracy": acc}


def rationale_context(prompt: str, chosen: str, rejected: str) -> str:
    """The user turn the LM reads before writing a rationale: the prompt and the pair, the chosen
    response shown as A (``"12+3= A: 15 B: 14 why A?"``)."""
    return f"{prompt} A: {chosen} B: {rejected} why A?"


def lm_rationale_nll(model, tokenizer, prompts: list[str], chosen: list[str], rejected: list[str],
                     rationales: list[str], gamma: float = 1.0) -> tuple[Tensor, dict]:
    """RDPO's rationale term on an LM (Just et al. 2024), per pair:
    -gamma log pi_theta(r | x, y_w, y_l) = -gamma sum_t log pi_theta(r_t | chat(c), r_<t), with the
    context c = ``rationale_context(x, y_w, y_l)`` as the user turn and the rationale's tokens plus
    the end-of-turn token as the assistant's (the same masking as ``lm_sequence_logps``).
    All lists have length B. Returns (losses (B,), metrics ``rationale/nll_per_token``)."""
    if not (len(prompts) == len(chosen) == len(rejected) == len(rationales)):
        raise ValueError(f"prompts, chosen, rejected and rationales must have one entry per pair, "
                         f"got lengths {len(prompts)}, {len(chosen)}, {len(rejected)}, {len(rationales)}")
    from agentrl_lib.rollout import chat_example, example_logps

    ex = [chat_example(tokenizer, rationale_context(p, c, r), z)
          for p, c, r, z in zip(prompts, chosen, rejected, rationales)]
    logp, mask = example_logps(model, ex, tokenizer.pad_token_id)  # (B, L-1) each
    nll = -(logp * mask).sum(-1)  # (B,)
    with torch.no_grad():
        per_token = (nll.sum() / mask.sum()).item()
    return gamma * nll, {"rationale/nll_per_token": per_token}
