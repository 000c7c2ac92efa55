"""B-Coder: value-based RL for program synthesis (Yu, Tao, Chen, Sun, Yang 2023, *B-Coder:
Value-Based Deep Reinforcement Learning for Program Synthesis*, arXiv:2310.03173; section and
equation numbers below are the paper's).

A program is a sequence of tokens; the state s_t is the prompt and the tokens so far, the action a_t
the next token, and the only reward is the unit-test verdict of the finished program on its last
action (the end-of-sequence token). B-Coder learns a Q-function from *off-policy* programs (right
and wrong alike), starting from a pre-trained LM p_ckpt, with a **conservative** Bellman operator;
the learned Q then decodes programs and **reranks** sampled ones.

- **The reward** (``test_reward``, eq. 2, CodeRL's reward, salesforce/CodeRL
  ``datasets/utils.py:get_reward_from_error_type``): +1 when the program passes every test, -0.3
  when it runs but fails a test, -0.6 when it cannot be executed (a test raises, or the sandbox
  stops it), -1 when it cannot be compiled (here: the stack language's parser rejects it).
- **The Q-head on the LM** (``QNet``, ``dueling_q``; eq. 16 with alpha = 1, App. H):
  Q(s, a) = V(s) + alpha * (logits(s, a) - max_b logits(s, b)), the LM's logits as the advantage
  and a scalar head V on the last hidden state, trained with the LM. max_a Q(s, a) = V(s) exactly,
  argmax_a Q is the LM part's greedy token, softmax(Q / alpha) its policy. Ours differs: one V head
  from a constant (the paper: a V_phi pre-trained in a phi-stage, eq. 12, then frozen, plus a
  residual head V^r_theta from 0, App. G.2) and no R_max cap (App. G.1).
- **The conservative operator** (``bootstrap_values``, ``operator='conservative'``, sec. 4.3
  eq. 14-15): the target bootstraps on the *frozen pre-trained LM's greedy next token*,
  y_t = r_t + gamma * SG(Q(s_{t+1}, a^_{t+1})), a^_{t+1} = argmax_a p_ckpt(a | s_{t+1}): policy
  evaluation of p_ckpt's greedy policy, so the target never takes a max over tokens whose Q the
  data never checked. ``'max'`` is B* (a^ = argmax_a Q(s', a), Fig. 1's "no conservative
  operator" ablation); ``'cql'`` (ours, a variant) is B* plus CQL's penalty (Kumar et al. 2020)
  logsumexp_a Q - Q(a_data) weighted by ``cql_alpha``: at alpha = 1 the penalty is exactly the
  LM's cross-entropy on *every* data program, right and wrong (notebook 71's theorem), the
  generic conservative fix the paper does not use. SG is the online net, detached (eq. 12, 15: no
  target network; ``target_every > 1`` keeps one, ours).
- **The fine-tuning loss** (``bcoder_loss``, eq. 17, betas of App. H):
  L = L_Q + beta_adv L_adv + beta_ce L_ce, L_Q the squared TD error (mean over the data tokens),
  L_adv = E_{W*} sum_t |A(s*_t, a*_t)| (eq. 8) and L_ce = E_{W*} sum_t -log softmax(Q/alpha)(a*_t)
  (eq. 1) over the *ground-truth* programs W* of the batch (here: the rows whose reward is +1).
- **Reranking** (``rerank_scores``, ``reduce='paper'``, sec. 4.5 eq. 18-20, the approximate form
  of App. F): the recovered reward r~(s_t, a_t) = Q(s_t, a_t) - gamma V(s_{t+1}), summed over the
  program (V of the state after the last token is 0: it is terminal, and the TD target there has
  no bootstrap). With the dueling head and gamma = 1 this is sum_t A(s_t, a_t) + V(s_0): a sum of
  the LM part's log-advantages, log-prob-like. ``'min'`` (min_t Q(s_t, a_t)) and ``'last'``
  (Q(s_T, eos)) are ours, kept as variants.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch import Tensor

from agentrl_lib.core import masked_mean
from agentrl_lib.envs import stack_lang
from agentrl_lib.rollout import join_sequences, model_device, pad_examples
from agentrl_lib.utils import optimizer_step, progress

OPERATORS = ("conservative", "max", "cql")
REWARD_LEVELS = {"pass": 1.0, "fail": -0.3, "runtime_error": -0.6, "compile_error": -1.0}
"""eq. 2's four levels (B-Coder sec. 3.1, after CodeRL, Le et al. 2022)."""


@dataclass
class BCoderConfig:
    operator: str = "conservative"
    """the Bellman operator: 'conservative' (B^q, eq. 14-15: bootstrap on the frozen pre-trained
    LM's greedy next token), 'max' (B*: on argmax_a Q) or 'cql' (B* + CQL's penalty; ours)"""
    cql_alpha: float = 1.0
    """weight of CQL's penalty (operator 'cql' only)"""
    beta_adv: float = 0.1
    """weight of L_adv, the advantage of ground-truth tokens (eq. 17; App. H)"""
    beta_ce: float = 0.5
    """weight of L_ce, the cross-entropy of softmax(Q / alpha) on ground-truth programs (eq. 17;
    App. H)"""
    alpha: float = 1.0
    """scale of the LM logits in Q (eq. 16; alpha = 1 in App. H): softmax(Q / alpha) is the LM"""
    gamma: float = 1.0
    """discount per token (the paper: 0.999, sec. 3.1; programs here are 1-6 tokens)"""
    lr: float = 1e-3
    """AdamW learning rate of the whole Q-net (LM and value head)"""
    num_iters: int = 200
    """Q-learning updates"""
    batch_size: int = 64
    """(prompt, program, reward) examples per update, drawn from the off-policy data"""
    target_every: int = 1
    """1: bootstrap on the online net, detached (eq. 12, 15); k > 1: on a target network copied
    every k updates (ours, a variant)"""
    max_grad_norm: float = 1.0
    """gradient-norm clip of every update"""
    seed: int = 0
    """draws of the batches"""


def unit_test_reward(program: str, result: dict) -> float:
    """eq. 2: the reward of ``program`` given its ``ProgramSynthTask.evaluate`` result: +1 passes
    every test, -0.3 runs but fails one, -0.6 cannot be executed (a test raises a StackError or
    the sandbox stops it), -1 cannot be compiled (``stack_lang.parse`` rejects a token).

    >>> unit_test_reward("inc", {"pass_rate": 1.0, "reason": "ok"})
    1.0
    >>> unit_test_reward("inc", {"pass_rate": 0.5, "reason": "ok"})
    -0.3
    >>> unit_test_reward("drop add", {"pass_rate": 0.0, "reason": "stack_error"})
    -0.6
    >>> unit_test_reward("inc pls", {"pass_rate": 0.0, "reason": "stack_error"})
    -1.0
    """
    try:
        stack_lang.parse(program)
    except stack_lang.StackError:
        return REWARD_LEVELS["compile_error"]
    if result["reason"] != "ok":
        return REWARD_LEVELS["runtime_error"]
    return REWARD_LEVELS["pass" if result["pass_rate"] == 1.0 else "fail"]


class QNet(nn.Module):
    """eq. 16's dueling Q on a causal LM, Q(s, a) = V(s) + alpha (logits(s, a) - max_b logits(s, b))
    (one V head; the paper's V_phi + V^r split and R_max cap are not built: module docstring).
    ``lm`` is the LM (a copy of the SFT model), ``v_head`` a linear head on its last hidden state
    whose weights start at 0 and bias at ``v_init``."""

    def __init__(self, lm, alpha: float, v_init: float = 0.0, detach_v: bool = True):
        super().__init__()
        self.lm, self.alpha, self.detach_v = lm, float(alpha), bool(detach_v)
        self.v_head = nn.Linear(lm.config.hidden_size, 1).to(model_device(lm))
        nn.init.zeros_(self.v_head.weight)
        nn.init.constant_(self.v_head.bias, float(v_init))

    def forward(self, input_ids: Tensor, attention_mask: Tensor,
                position_ids: Tensor | None = None):
        """(q, v): q (B, L, V) the Q-values of every next token at every position, v (B, L)."""
        out = self.lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                      output_hidden_states=True)
        h = out.hidden_states[-1]  # (B, L, H)
        v = self.v_head(h.detach() if self.detach_v else h).squeeze(-1)  # (B, L)
        return dueling_q(out.logits.float(), v, self.alpha), v


def dueling_q(logits: Tensor, v: Tensor, alpha: float) -> Tensor:
    """eq. 16: Q = v + alpha (logits - max logits): logits (..., V), v (...) -> Q (..., V)."""
    adv = logits - logits.max(-1, keepdim=True).values  # (..., V) <= 0, 0 at the argmax
    return v[..., None] + alpha * adv


def bootstrap_values(q_next: Tensor, operator: str,
                     base_logits_next: Tensor | None = None) -> Tensor:
    """Q(s_{t+1}, a^_{t+1}), the value the target bootstraps on after each token (B, T), from
    q_next (B, T, V), Q(s_{t+1}, .) (already detached: SG of eq. 15):

    - 'conservative' (B^q, eq. 14): a^ = argmax_a p_ckpt(a | s_{t+1}), the frozen pre-trained LM's
      greedy token; ``base_logits_next`` (B, T, V) are p_ckpt's logits at s_{t+1};
    - 'max' and 'cql' (B*): a^ = argmax_a Q(s_{t+1}, a), i.e. max_a Q(s_{t+1}, a).

    >>> q = torch.tensor([[[0.25, 0.75, 0.5]]])  # Q(s', .) over 3 tokens
    >>> base = torch.tensor([[[3.0, 1.0, 2.0]]])  # p_ckpt's logits at s': its greedy token is 0
    >>> bootstrap_values(q, "conservative", base).tolist()
    [[0.25]]
    >>> bootstrap_values(q, "max").tolist()
    [[0.75]]
    """
    if operator == "conservative":
        if base_logits_next is None:
            raise ValueError("the conservative operator needs the pre-trained LM's logits")
        a_hat = base_logits_next.argmax(-1)  # (B, T)
        return q_next.gather(-1, a_hat[..., None]).squeeze(-1)
    if operator in ("max", "cql"):
        return q_next.max(-1).values
    raise ValueError(f"operator must be one of {OPERATORS}, got {operator!r}")


def bellman_targets(next_q: Tensor, rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """Token-level targets y_t of a batch of programs (rlax-style names, eq. 15):

    y_t = gamma * Q(s_{t+1}, a^_{t+1}) for every token but the last, y_T = r (terminal).

    next_q (B, T): the bootstrap value after token t (``bootstrap_values``); rewards (B,): the
    test reward; mask (B, T): 1 on the program's tokens (its end-of-sequence token included).
    Returns (B, T), 0 off the mask. The last real token of a row is where its mask ends.

    >>> bellman_targets(torch.tensor([[.5, .7, .9]]), torch.tensor([1.]),
    ...                 torch.tensor([[1., 1., 1.]]), 1.0).tolist()
    [[0.5, 0.699999988079071, 1.0]]
    """
    last = mask * (1 - torch.cat([mask[:, 1:], torch.zeros_like(mask[:, :1])], 1))  # (B, T) 1 at T
    boot = gamma * next_q * (mask - last)  # (B, T)
    return boot + last * rewards[:, None]


def cql_penalty(q_all: Tensor, q_data: Tensor, mask: Tensor) -> tuple[Tensor, dict]:
    """CQL's conservative penalty (the 'cql' variant, not the paper's), mean over the data tokens
    of logsumexp_a Q(s, a) - Q(s, a_data). q_all (B, T, V), q_data (B, T), mask (B, T).
    logsumexp >= max >= Q(s, a_data): it is >= 0, and its gradient lowers every token's Q in
    proportion to softmax(Q) while raising the data's."""
    gap = torch.logsumexp(q_all, -1) - q_data  # (B, T) >= 0
    value = masked_mean(gap, mask)
    return value, {"losses/cql": value.item()}


def td_loss(q_data: Tensor, targets: Tensor, mask: Tensor) -> tuple[Tensor, dict]:
    """L_Q (eq. 15): the squared Bellman error, mean over the data tokens (q_data, targets, mask
    all (B, T)); the targets are detached (SG)."""
    value = masked_mean((q_data - targets.detach()) ** 2, mask)
    return value, {"losses/td": value.item()}


def imitation_losses(q_all: Tensor, actions: Tensor, mask: Tensor, gt: Tensor,
                     alpha: float) -> tuple[Tensor, Tensor]:
    """(L_adv, L_ce) of eq. 17 over the ground-truth rows (gt (B,) 1 for a ground-truth program):
    L_adv = E_{W*} sum_t |A(s_t, a_t)| with A = Q - max_b Q (eq. 8), L_ce = E_{W*} sum_t
    -log softmax(Q(s_t, .) / alpha)[a_t] (eq. 1): sums over a program's tokens, means over the
    ground-truth programs (0 when the batch has none). q_all (B, T, V), actions, mask (B, T)."""
    q_data = q_all.gather(-1, actions[..., None]).squeeze(-1)  # (B, T)
    adv = q_data - q_all.max(-1).values  # (B, T) <= 0
    nll = -torch.log_softmax(q_all / alpha, -1).gather(-1, actions[..., None]).squeeze(-1)
    w = mask * gt[:, None]  # (B, T) the ground-truth programs' tokens
    n = gt.sum().clamp(min=1.0)
    return (adv.abs() * w).sum() / n, (nll * w).sum() / n


def bcoder_loss(q_all: Tensor, next_q: Tensor, actions: Tensor, rewards: Tensor, mask: Tensor,
                cfg: BCoderConfig) -> tuple[Tensor, dict]:
    """eq. 17: L_Q + beta_adv L_adv + beta_ce L_ce (+ cql_alpha * CQL penalty for operator 'cql').
    q_all (B, T, V): Q(s_t, .) of the online net before each program token; next_q (B, T): the
    bootstrap value (``bootstrap_values``); actions (B, T): the program's tokens; rewards (B,) the
    test rewards (the ground-truth rows are those at +1); mask (B, T)."""
    q_data = q_all.gather(-1, actions[..., None]).squeeze(-1)  # (B, T)
    y = bellman_targets(next_q, rewards, mask, cfg.gamma)  # (B, T)
    td, metrics = td_loss(q_data, y, mask)
    gt = (rewards == REWARD_LEVELS["pass"]).float()  # (B,)
    l_adv, l_ce = imitation_losses(q_all, actions, mask, gt, cfg.alpha)
    loss = td + cfg.beta_adv * l_adv + cfg.beta_ce * l_ce
    if cfg.operator == "cql":
        cql, m2 = cql_penalty(q_all, q_data, mask)
        loss, metrics = loss + cfg.cql_alpha * cql, {**metrics, **m2}
    return loss, {**metrics, "losses/adv": l_adv.item(), "losses/ce": l_ce.item(),
                  "charts/q_data": masked_mean(q_data, mask).item(),
                  "charts/target": masked_mean(y, mask).item()}


def program_batch(examples: list[tuple[list[int], list[int]]], pad_id: int, device):
    """Right-padded (ids, attn, positions, loss mask) of (ids, mask) chat examples, and the index of
    the program tokens: the Q-values that score token t of the sequence sit at position t - 1.
    Returns ids, attn (B, L); mask (B, L-1): 1 where position t-1 predicts a program token t."""
    ids, attn, mask = pad_examples(examples, pad_id, device)  # (B, L) each
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return ids, attn, pos, mask[:, 1:]


def update(qnet: QNet, target: QNet | None, opt, examples, rewards: Tensor, cfg: BCoderConfig,
           pad_id: int, base=None) -> dict:
    """One step of eq. 17 on a batch of off-policy (ids, mask) examples with their rewards (B,).
    ``target`` None: bootstrap on the online net, detached; ``base``: the frozen pre-trained LM
    p_ckpt (needed by the conservative operator)."""
    device = model_device(qnet)
    ids, attn, pos, mask = program_batch(examples, pad_id, device)
    q, _ = qnet(ids, attn, pos)  # (B, L, V)
    with torch.no_grad():
        q_next = (q if target is None else target(ids, attn, pos)[0])[:, 1:].detach()  # (B, L-1, V)
        base_next = None
        if cfg.operator == "conservative":
            if base is None:
                raise ValueError("the conservative operator needs base, the pre-trained LM")
            base_next = base(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, 1:]
    next_q = bootstrap_values(q_next, cfg.operator, base_next)  # (B, L-1)
    loss, metrics = bcoder_loss(q[:, :-1], next_q, ids[:, 1:], rewards.to(device), mask, cfg)
    optimizer_step(opt, loss, cfg.max_grad_norm)
    metrics["losses/loss"] = loss.item()
    return metrics


def train(qnet: QNet, examples, rewards: list[float], cfg: BCoderConfig, pad_id: int, base=None,
          log_every: int = 50, verbose: bool = False) -> list[dict]:
    """``cfg.num_iters`` updates on batches drawn uniformly from the off-policy data (examples:
    [(ids, mask)] chat examples, rewards: the test reward of each; ``base``: the frozen
    pre-trained LM, for the conservative operator). Returns the logged metrics."""
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.AdamW(qnet.parameters(), lr=cfg.lr, weight_decay=0.0)
    target = copy.deepcopy(qnet).eval() if cfg.target_every > 1 else None
    if base is not None:
        base.eval()
    r = torch.tensor(rewards, dtype=torch.float)
    history = []
    qnet.train()
    for it in progress(range(cfg.num_iters), desc="bcoder"):
        if target is not None and it % cfg.target_every == 0:
            target.load_state_dict(qnet.state_dict())
        idx = torch.randint(len(examples), (min(cfg.batch_size, len(examples)),), generator=gen)
        m = update(qnet, target, opt, [examples[i] for i in idx.tolist()], r[idx], cfg, pad_id,
                   base)
        if it % log_every == 0 or it == cfg.num_iters - 1:
            history.append({"iter": it, **m})
            if verbose:
                print(f"  q-learning {it:4d}  td {m['losses/td']:.4f}  ce {m['losses/ce']:.3f}",
                      flush=True)
    qnet.eval()
    return history


@torch.no_grad()
def rerank_scores(qnet: QNet, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                  completion_mask: Tensor, reduce: str = "paper", gamma: float = 1.0) -> Tensor:
    """The rerank score of each sampled program (B,):

    - 'paper' (eq. 19-20, App. F's approximate form): sum_t [Q(s_t, a_t) - gamma V(s_{t+1})],
      V(s) = max_a Q(s, a) (= the V head with the dueling Q), 0 after the last token (terminal);
    - 'last' (ours): Q(s_T, a_T), the Q of the last action, the learned estimate of the reward;
    - 'min' (ours): the lowest Q(s_t, a_t) over the program's tokens.

    Inputs as ``rollout.Generation`` (prompt left-padded (B, P), completion right-padded (B, T))."""
    ids, attn, pos = join_sequences(prompt_ids, prompt_mask, completion_ids, completion_mask)
    q, _ = qnet(ids, attn, pos)  # (B, P+T, V)
    P = prompt_ids.shape[1]
    mask = completion_mask.float()
    q_tok = q[:, P - 1:-1].gather(-1, completion_ids[..., None]).squeeze(-1)  # (B, T)
    if reduce == "paper":
        v_next = q[:, P:].max(-1).values  # (B, T) V(s_{t+1}), the state after token t
        alive = torch.cat([mask[:, 1:], torch.zeros_like(mask[:, :1])], 1)  # s_{t+1} not terminal
        return ((q_tok - gamma * v_next * alive) * mask).sum(-1)
    if reduce == "min":
        return q_tok.masked_fill(mask == 0, float("inf")).min(-1).values
    if reduce != "last":
        raise ValueError(f"reduce must be 'paper', 'last' or 'min', got {reduce!r}")
    last = completion_mask.sum(-1).clamp(min=1) - 1  # (B,)
    return q_tok.gather(1, last[:, None]).squeeze(1)


def pick_best(scores: Tensor, group_size: int) -> Tensor:
    """Index (into the flat batch) of the highest score of each consecutive group: scores (B*G,)
    -> (B,); ties go to the first sample."""
    s = scores.view(-1, group_size)  # (B, G)
    return torch.arange(s.shape[0], device=s.device) * group_size + s.argmax(-1)


def sequence_score(logps: Tensor, mask: Tensor) -> Tensor:
    """The SFT baseline's rerank score: the sum of the sampled program's token log-probs (B,)."""
    return (logps * mask).sum(-1)


__all__ = ["OPERATORS", "REWARD_LEVELS", "BCoderConfig", "unit_test_reward", "QNet", "dueling_q",
           "bootstrap_values", "bellman_targets", "cql_penalty", "td_loss", "imitation_losses",
           "bcoder_loss", "program_batch", "update", "train", "rerank_scores", "pick_best",
           "sequence_score"]
