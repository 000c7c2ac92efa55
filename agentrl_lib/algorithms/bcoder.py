"""B-Coder: value-based RL for program synthesis (Yu, Tao, Chen, Sun, Yang 2023, *B-Coder:
Value-Based Deep Reinforcement Learning for Program Synthesis*, arXiv:2310.03173).

A program is a sequence of tokens; the state s_t is the prompt and the tokens so far, the action a_t
the next token, and the only reward is the unit-test verdict of the finished program (1 when it
passes every test, else 0) on its last action (the end-of-sequence token). B-Coder learns a
Q-function from *off-policy* programs (human-written, right and wrong alike), starting from a
pre-trained LM, with a **conservative** Bellman operator so that the max in the target does not
feed on over-estimated tokens the data never took; the learned Q then decodes programs and
**reranks** sampled ones.

What this module does (each choice below is ours where the paper's large-scale recipe does not
carry over to a 0.1M-parameter character LM; all are marked *inferred*):

- **The Q-head on the LM** (``QNet``, inferred dueling parametrisation):
  Q(s, a) = V(s) + alpha * (logits(s, a) - max_b logits(s, b)),
  the LM's logits as an advantage (0 for the LM's favourite token, negative for the others) plus a
  new scalar head V(s) on the last hidden state. At initialisation argmax_a Q = the SFT LM's greedy
  token and softmax(Q / alpha) = the SFT policy, as B-Coder's initialisation from the pre-trained LM
  intends; max_a Q(s, a) = V(s) exactly, so the Bellman optimality target is V of the next state.
- **Token-level Bellman targets** (``bellman_targets``): y_t = r_t + gamma * max_a Qbar(s_{t+1}, a)
  before the last token, y_T = r (the test verdict) on the last token; Qbar is a target network
  copied every ``target_every`` updates (inferred: the paper's target/Polyak details differ).
- **The conservative penalty** (``cql_penalty``): CQL's logsumexp_a Q(s, a) - Q(s, a_data),
  averaged over the data tokens (inferred: B-Coder's conservative operator is its own; CQL is the
  form the catalog names). ``cql_alpha = 0`` is plain (non-conservative) Q-learning.
- **Decoding from Q**: greedy argmax_a Q(s, a) is the greedy token of the Q-net's LM part (alpha > 0
  and V do not change the argmax), so ``rollout.generate(greedy=True)`` on ``QNet.lm`` decodes from
  Q; sampling softmax(Q / alpha) is sampling the LM part at temperature 1.
- **Q-reranking** (``rerank_scores``): of N sampled programs, keep the one with the highest score:
  ``reduce='min'``, the worst step min_t Q(s_t, a_t) (a perfect Q is 1 on every step of a right
  program and 0 from the first step after which none can follow), or ``reduce='last'``, the Q of
  the last action Q(s_{T-1}, eos), the learned estimate of that very program's verdict (inferred:
  the paper ranks with its learned Q combined with the LM; the first state's value V(s_0) is the
  same for every sample and cannot rank). Notebook 71 uses 'min' (chosen in exploration, post hoc).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch import Tensor

from agentrl_lib.core import masked_mean
from agentrl_lib.rollout import join_sequences, model_device, pad_examples
from agentrl_lib.utils import optimizer_step, progress


@dataclass
class BCoderConfig:
    cql_alpha: float = 1.0
    """weight of the conservative penalty (0: plain Q-learning, the non-conservative arm)"""
    alpha: float = 0.5
    """scale of the LM logits in Q (the dueling advantage; inferred): softmax(Q / alpha) is the LM"""
    gamma: float = 1.0
    """discount per token (programs are short and the reward is terminal)"""
    lr: float = 1e-3
    """AdamW learning rate of the whole Q-net (LM and value head)"""
    num_iters: int = 200
    """Q-learning updates"""
    batch_size: int = 64
    """(prompt, program, reward) examples per update, drawn from the off-policy data"""
    target_every: int = 20
    """updates between copies of the online Q-net into the target network"""
    max_grad_norm: float = 1.0
    """gradient-norm clip of every update"""
    seed: int = 0
    """draws of the batches"""


class QNet(nn.Module):
    """Q(s, a) = V(s) + alpha (logits(s, a) - max_b logits(s, b)) on a causal LM (module docstring).
    ``lm`` is the LM (a copy of the SFT model), ``v_head`` a linear head on its last hidden state
    whose weights start at 0 and bias at ``v_init``."""

    def __init__(self, lm, alpha: float, v_init: float = 0.0, detach_v: bool = True):
        super().__init__()
        self.lm, self.alpha, self.detach_v = lm, float(alpha), bool(detach_v)
        self.v_head = nn.Linear(lm.config.hidden_size, 1).to(model_device(lm))
        nn.init.zeros_(self.v_head.weight)
        nn.init.constant_(self.v_head.bias, float(v_init))

    def forward(self, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor | None = None):
        """(q, v): q (B, L, V) the Q-values of every next token at every position, v (B, L)."""
        out = self.lm(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                      output_hidden_states=True)
        h = out.hidden_states[-1]  # (B, L, H)
        v = self.v_head(h.detach() if self.detach_v else h).squeeze(-1)  # (B, L)
        return dueling_q(out.logits.float(), v, self.alpha), v


def dueling_q(logits: Tensor, v: Tensor, alpha: float) -> Tensor:
    """Q = v + alpha (logits - max logits): logits (..., V), v (...) -> Q (..., V)."""
    adv = logits - logits.max(-1, keepdim=True).values  # (..., V) <= 0, 0 at the argmax
    return v[..., None] + alpha * adv


def bellman_targets(next_max_q: Tensor, rewards: Tensor, mask: Tensor, gamma: float) -> Tensor:
    """Token-level targets y_t of a batch of programs (rlax-style names):

    y_t = gamma * max_a Qbar(s_{t+1}, a) for every token but the last, y_T = r (terminal).

    next_max_q (B, T): max_a Qbar(s_{t+1}, a) after token t; rewards (B,): the test verdict;
    mask (B, T): 1 on the program's tokens (its end-of-sequence token included). Returns (B, T),
    0 off the mask. The last real token of a row is where its mask ends.

    >>> bellman_targets(torch.tensor([[.5, .7, .9]]), torch.tensor([1.]), torch.tensor([[1., 1., 1.]]), 1.0).tolist()
    [[0.5, 0.699999988079071, 1.0]]
    """
    last = mask * (1 - torch.cat([mask[:, 1:], torch.zeros_like(mask[:, :1])], 1))  # (B, T) 1 at T
    boot = gamma * next_max_q * (mask - last)  # (B, T)
    return boot + last * rewards[:, None]


def cql_penalty(q_all: Tensor, q_data: Tensor, mask: Tensor) -> tuple[Tensor, dict]:
    """CQL's conservative penalty, mean over the data tokens of logsumexp_a Q(s, a) - Q(s, a_data).
    q_all (B, T, V), q_data (B, T), mask (B, T). logsumexp >= max >= Q(s, a_data): it is >= 0, and
    its gradient lowers every token's Q in proportion to softmax(Q) while raising the data's."""
    gap = torch.logsumexp(q_all, -1) - q_data  # (B, T) >= 0
    value = masked_mean(gap, mask)
    return value, {"losses/cql": value.item()}


def td_loss(q_data: Tensor, targets: Tensor, mask: Tensor) -> tuple[Tensor, dict]:
    """Mean squared Bellman error over the data tokens: q_data, targets, mask all (B, T)."""
    value = masked_mean((q_data - targets.detach()) ** 2, mask)
    return value, {"losses/td": value.item()}


def bcoder_loss(q_all: Tensor, next_max_q: Tensor, actions: Tensor, rewards: Tensor, mask: Tensor,
                cfg: BCoderConfig) -> tuple[Tensor, dict]:
    """TD loss + cql_alpha * CQL penalty. q_all (B, T, V): Q(s_t, .) of the online net before each
    program token; next_max_q (B, T): max_a Qbar(s_{t+1}, a) of the target net; actions (B, T): the
    program's tokens; rewards (B,); mask (B, T)."""
    q_data = q_all.gather(-1, actions[..., None]).squeeze(-1)  # (B, T)
    y = bellman_targets(next_max_q, rewards, mask, cfg.gamma)  # (B, T)
    td, m1 = td_loss(q_data, y, mask)
    cql, m2 = cql_penalty(q_all, q_data, mask)
    loss = td + cfg.cql_alpha * cql
    return loss, {**m1, **m2, "charts/q_data": masked_mean(q_data, mask).item(),
                  "charts/target": masked_mean(y, mask).item()}


def program_batch(examples: list[tuple[list[int], list[int]]], pad_id: int, device):
    """Right-padded (ids, attn, positions, loss mask) of (ids, mask) chat examples, and the index of
    the program tokens: the Q-values that score token t of the sequence sit at position t - 1.
    Returns ids, attn (B, L); mask (B, L-1): 1 where position t-1 predicts a program token t."""
    ids, attn, mask = pad_examples(examples, pad_id, device)  # (B, L) each
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return ids, attn, pos, mask[:, 1:]


def q_of_examples(qnet: QNet, ids: Tensor, attn: Tensor, pos: Tensor):
    """(q_all, next_max_q_input): q (B, L-1, V) Q(s_t, .) at the states before tokens 1..L-1 and
    the max_a Q (B, L-1) at the state *after* each of those tokens (position t), for the target."""
    q, _ = qnet(ids, attn, pos)  # (B, L, V)
    return q[:, :-1], q[:, 1:].max(-1).values


def update(qnet: QNet, target: QNet, opt, examples, rewards: Tensor, cfg: BCoderConfig,
           pad_id: int) -> dict:
    """One Q-learning step on a batch of off-policy (ids, mask) examples with their rewards (B,)."""
    device = model_device(qnet)
    ids, attn, pos, mask = program_batch(examples, pad_id, device)
    q_all, _ = q_of_examples(qnet, ids, attn, pos)  # (B, L-1, V)
    with torch.no_grad():
        _, next_max_q = q_of_examples(target, ids, attn, pos)  # (B, L-1)
    loss, metrics = bcoder_loss(q_all, next_max_q, ids[:, 1:], rewards.to(device), mask, cfg)
    optimizer_step(opt, loss, cfg.max_grad_norm)
    metrics["losses/loss"] = loss.item()
    return metrics


def train(qnet: QNet, examples, rewards: list[float], cfg: BCoderConfig, pad_id: int,
          log_every: int = 50, verbose: bool = False) -> list[dict]:
    """``cfg.num_iters`` updates on batches drawn uniformly from the off-policy data (examples:
    [(ids, mask)] chat examples, rewards: the verdict of each). Returns the logged metrics."""
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.AdamW(qnet.parameters(), lr=cfg.lr, weight_decay=0.0)
    target = copy.deepcopy(qnet).eval()
    r = torch.tensor(rewards, dtype=torch.float)
    history = []
    qnet.train()
    for it in progress(range(cfg.num_iters), desc="bcoder"):
        if it % cfg.target_every == 0:
            target.load_state_dict(qnet.state_dict())
        idx = torch.randint(len(examples), (min(cfg.batch_size, len(examples)),), generator=gen)
        m = update(qnet, target, opt, [examples[i] for i in idx.tolist()], r[idx], cfg, pad_id)
        if it % log_every == 0 or it == cfg.num_iters - 1:
            history.append({"iter": it, **m})
            if verbose:
                print(f"  q-learning {it:4d}  td {m['losses/td']:.4f}  cql {m['losses/cql']:.3f}",
                      flush=True)
    qnet.eval()
    return history


@torch.no_grad()
def rerank_scores(qnet: QNet, prompt_ids: Tensor, prompt_mask: Tensor, completion_ids: Tensor,
                  completion_mask: Tensor, reduce: str = "last") -> Tensor:
    """The rerank score of each sampled program: 'last', Q(s_{T-1}, a_T), the Q-value of its last
    action (the end-of-sequence token), the learned estimate of its test verdict; 'min', the
    lowest Q(s_t, a_t) over its tokens. Inputs as ``rollout.Generation`` (prompt left-padded
    (B, P), completion right-padded (B, T)); returns (B,)."""
    ids, attn, pos = join_sequences(prompt_ids, prompt_mask, completion_ids, completion_mask)
    q, _ = qnet(ids, attn, pos)  # (B, P+T, V)
    P = prompt_ids.shape[1]
    q_tok = q[:, P - 1:-1].gather(-1, completion_ids[..., None]).squeeze(-1)  # (B, T)
    if reduce == "min":  # the worst step: a perfect Q is 1 on every step of a right program
        return q_tok.masked_fill(completion_mask == 0, float("inf")).min(-1).values
    if reduce != "last":
        raise ValueError(f"reduce must be 'last' or 'min', got {reduce!r}")
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


__all__ = ["BCoderConfig", "QNet", "dueling_q", "bellman_targets", "cql_penalty", "td_loss",
           "bcoder_loss", "program_batch", "q_of_examples", "update", "train", "rerank_scores",
           "pick_best", "sequence_score"]
