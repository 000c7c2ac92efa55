"""ArCHer: an off-policy turn-level critic and a policy-gradient actor (Zhou et al. 2024).

Zhou, Zanette, Pan, Levine, Kumar (2024), *ArCHer: Training Language Model Agents via Hierarchical
Multi-Turn RL*, arXiv:2402.19446. Two levels:

- **high level (turns)**: a critic over utterances, trained off-policy by TD from a replay buffer
  with a soft-updated target network. Per critic member e (the reference uses two, "double critic"):

      Q_e(s_t, a_t) <- r_t + gamma (1 - done_t) V_e^targ(s_{t+1})          (TD target)
      V_e(s_t)      <- E_{a ~ pi(.|s_t)} Q_e^targ(s_t, a)                    (V target)
      theta^targ    <- (1 - tau) theta^targ + tau theta                      (soft update)

- **low level (tokens)**: the actor is updated by REINFORCE with the turn advantage
  A(s_t, a) = min_e Q_e(s_t, a) - min_e V_e(s_t), the same value on every token of the turn
  (``token_advantages``, via ``credit.to_token_advantages``).

Taken from the reference implementation (github.com/YifeiZhou02/ArCHer, ``trainer.py``,
``critic.py``, ``offpolicy_train_loop.py``): the two critic members with min for the advantage,
Q regressed on r + gamma V^targ(s'), V regressed on Q^targ(s, a ~ pi), gamma = 0.9, tau = 0.1,
critic lr 1e-3, a warm-up in which only the critic trains, the actor trained on states *sampled
from the replay buffer* with a fresh action a ~ pi(.|s) and loss -mean(log pi(a|s) A(s, a)).
Inferred / ours: the V target uses the exact expectation over the symbolic action set when the
policy's probabilities are given (the reference samples one action; with ``policy_probs=None`` we
use the action in the buffer, i.e. V of the behaviour policy); critics read features of the
environment's hashable state key (one-hot = tabular) instead of a RoBERTa embedding of the text;
a malformed turn (no symbolic action) is one extra action column.

**The LM actor** (notebook 32, last part): ``lm_train``, the reference's ``ArcherTrainer.update``
on ``loop.run`` with the one LM sampler (``grpo.episode_sampler``) and an MLP critic over
``env.key_features`` (``key_critic``). Each round the rollouts go into the replay buffer with each
turn's context (the conversation's token ids before the action); the V term of the TD steps uses
one fresh action of the current LM for each of ``v_samples`` replayed states (the reference draws
one per sampled transition; a pool a round is what our cost allows); after the warm-up the actor
takes ``actor_updates`` steps, each on ``actor_batch_size`` replayed states with a fresh action
(``lm_actor_step``), REINFORCE with A and log pi(a|s) the sum of the action's token log-probs.
The variant (ours until issue 27): ``lm_credit_fn`` plugs the critic into ``grpo.train(...,
credit_fn=)``, so the actor takes one step per rollout batch on that batch's own turns (rho = 1:
REINFORCE with A) and the V target is Q^targ of the logged action: an on-policy actor behind an
off-policy critic.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from agentrl_lib.algorithms import agent_pg, credit, loop
from agentrl_lib.models.policies import KeyRows
from agentrl_lib.rollout import (episode_stats, model_device, play_episodes, sample_turns,
                                 sequence_logps, token_generator)
from agentrl_lib.utils import optimizer_step

Tensor = torch.Tensor


@dataclass
class ArcherConfig:
    num_iters: int = 40
    """rollout rounds (each adds ``episodes_per_iter`` episodes to the replay buffer)"""
    episodes_per_iter: int = 16
    """environment episodes collected per round (the reference's rollout_size)"""
    gamma: float = 0.9
    """turn-level discount of the critic (reference default 0.9)"""
    tau: float = 0.1
    """soft target update rate (reference default 0.1)"""
    critic_lr: float = 1e-3
    """Adam learning rate of the critic (reference default 1e-3)"""
    critic_optimizer: str = "adam"
    """'adam' (the reference) or 'sgd' (plain steps: right for a table, where Adam's momentum
    keeps moving rows that are not in the batch)"""
    actor_lr: float = 0.1
    """Adam learning rate of the actor (tabular scale; the reference's LM uses 1e-5)"""
    batch_size: int = 64
    """transitions (critic) or replayed states (actor) per gradient step"""
    critic_updates: int = 20
    """critic gradient steps per round (each followed by a soft target update)"""
    actor_updates: int = 5
    """actor gradient steps per round (the reference's actor_epochs: each one optimizer step)"""
    actor_batch_size: int | None = None
    """replayed states per actor step; None: ``batch_size`` (the LM actor: one generated action
    and one forward and backward pass per state)"""
    v_samples: int = 64
    """LM actor (``lm_train``) with ``v_target='policy'``: replayed states given one fresh action
    of the current policy per round, the states and actions of every TD step's V term"""
    warmup_iters: int = 2
    """rounds in which only the critic trains (reference: warmup_iter)"""
    capacity: int = 100_000
    """replay buffer size in transitions"""
    num_critics: int = 2
    """critic members; targets per member, the advantage takes the min over members"""
    hidden: int = 0
    """0: linear critic on the features (one-hot features = a table); >0: MLP width"""
    v_target: str = "policy"
    """'policy': V(s) <- E_{a~pi} Q^targ(s, a) under the current policy (the reference: one
    fresh sample; a table takes the expectation, the LM ``v_samples`` fresh samples a round);
    'logged': V(s) <- Q^targ(s, a_logged) (V of the behaviour mix in the buffer; ours)"""
    actor_actions: str = "fresh"
    """'fresh': a ~ pi(.|s) on replayed states (the reference); 'buffer': the logged action of
    the replayed turn (only pairs the critic has data for; ours)"""
    entropy_coef: float = 0.0
    """actor entropy bonus beta (ours; the reference has none): L -= beta * H(pi(.|s))"""
    max_grad_norm: float | None = None
    """gradient-norm clip of critic and actor steps (None: off)"""
    bootstrap_truncated: bool = True
    """bootstrap V^targ(s') when an episode hit the turn cap; set False when the turn is part of
    the state key, so the capped state is terminal (TwentyQuestions)"""
    eval_every: int = 5
    """rounds between evaluations (``loop.run``)"""
    seed: int = 0
    """seed of the task draws and the replay sampling"""


# --- features of state keys ----------------------------------------------------------------------
class OneHotKeys:
    """features(key) -> one-hot (capacity,), an index assigned at the key's first sight. With a
    linear critic this is exactly a table Q[key, a] (zero-initialised)."""

    def __init__(self, capacity: int = 4096):
        self.capacity, self.index = capacity, KeyRows(capacity, "OneHotKeys")

    def row(self, key) -> int:
        return self.index.row(key)

    def __call__(self, key) -> np.ndarray:
        x = np.zeros(self.capacity, dtype=np.float32)
        x[self.row(key)] = 1.0
        return x

    @property
    def dim(self) -> int:
        return self.capacity


class TurnCritic(nn.Module):
    """Q_e(s, .) over ``num_actions + 1`` columns (the last: a malformed turn) and V_e(s), for
    e < num_critics, from ``features(state_key) -> (D,)``.

    hidden=0: linear and zero-initialised (a table on one-hot features); hidden>0: the reference's
    3-layer ReLU MLP per head.
    """

    def __init__(self, num_actions: int, features=None, feature_dim: int | None = None,
                 hidden: int = 0, num_critics: int = 2):
        super().__init__()
        self.features = features if features is not None else OneHotKeys()
        D = feature_dim if feature_dim is not None else self.features.dim
        self.num_actions, self.num_critics, self.hidden = num_actions, num_critics, hidden
        self.feature_dim = D
        A1 = num_actions + 1

        # one-hot features with a linear critic: store the table itself (same function, no
        # dense one-hot vectors), zero-initialised
        self.tabular = hidden == 0 and isinstance(self.features, OneHotKeys)

        def head(out):
            if self.tabular:
                table = nn.Embedding(self.features.capacity, out)
                nn.init.zeros_(table.weight)
                return table
            if hidden == 0:
                lin = nn.Linear(D, out)
                nn.init.zeros_(lin.weight)
                nn.init.zeros_(lin.bias)
                return lin
            return nn.Sequential(nn.Linear(D, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                                 nn.ReLU(), nn.Linear(hidden, out))

        self.q_head = head(num_critics * A1)
        self.v_head = head(num_critics)

    def encode(self, keys) -> Tensor:
        if self.tabular:
            return torch.tensor([self.features.row(k) for k in keys], dtype=torch.long,
                                device=self.device)  # (B,)
        return torch.as_tensor(np.stack([self.features(k) for k in keys]),
                               device=self.device)  # (B, D)

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def forward(self, keys) -> tuple[Tensor, Tensor]:
        x = self.encode(keys)  # (B, D) features, or (B,) table rows
        q = self.q_head(x).view(len(keys), self.num_critics, self.num_actions + 1)  # (B, E, A+1)
        v = self.v_head(x)  # (B, E)
        return q, v

    def copy(self) -> "TurnCritic":
        """A frozen copy with the same weights that shares the feature map (so one-hot indices
        agree between the online and the target network)."""
        twin = TurnCritic(self.num_actions, self.features, self.feature_dim, self.hidden,
                          self.num_critics)
        twin.load_state_dict(self.state_dict())
        for p in twin.parameters():
            p.requires_grad_(False)
        return twin


# --- pure pieces ---------------------------------------------------------------------------------
def td_targets(r_t: Tensor, done_t: Tensor, v_tp1: Tensor, gamma: float) -> Tensor:
    """y_t = r_t + gamma (1 - done_t) v_tp1; r_t, done_t: (B,), v_tp1: (B, E) -> (B, E).

    >>> td_targets(torch.tensor([0., 1.]), torch.tensor([0., 1.]), torch.tensor([[2.], [5.]]), 0.5)
    tensor([[1.],
            [1.]])
    """
    return r_t[:, None] + gamma * (1.0 - done_t[:, None]) * v_tp1


def v_targets(q_t: Tensor, probs: Tensor | None = None, a_t: Tensor | None = None) -> Tensor:
    """V target per member: sum_a pi(a|s) Q_e^targ(s, a) when ``probs`` (B, A) are given, else
    Q_e^targ(s, a_t) of the buffer's action. q_t: (B, E, A+1) -> (B, E)."""
    if probs is not None:
        A = probs.shape[-1]
        return (q_t[..., :A] * probs[:, None, :].to(q_t.dtype)).sum(-1)
    return q_t.gather(-1, a_t.view(-1, 1, 1).expand(-1, q_t.shape[1], 1)).squeeze(-1)


@torch.no_grad()
def soft_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """theta^targ <- (1 - tau) theta^targ + tau theta, in place."""
    for pt, p in zip(target.parameters(), online.parameters()):
        pt.mul_(1.0 - tau).add_(p, alpha=tau)


def advantages_from_critic(q: Tensor, v: Tensor, a: Tensor) -> Tensor:
    """A(s, a) = min_e Q_e(s, a) - min_e V_e(s); q: (B, E, A+1), v: (B, E), a: (B,) -> (B,)."""
    q_a = q.gather(-1, a.view(-1, 1, 1).expand(-1, q.shape[1], 1)).squeeze(-1)  # (B, E)
    return q_a.min(-1).values - v.min(-1).values


def actor_loss(logps: Tensor, adv: Tensor, entropy: Tensor | None = None,
               entropy_coef: float = 0.0) -> tuple[Tensor, dict]:
    """REINFORCE with the critic's advantage: L = -mean(log pi(a|s) A(s, a)) - beta mean H, with
    A held fixed; logps, adv, entropy: (B,)."""
    loss = -(logps * adv.detach()).mean()
    metrics = {"adv_mean": adv.mean().item(), "adv_abs": adv.abs().mean().item()}
    if entropy is not None:
        metrics["entropy"] = entropy.mean().item()
        loss = loss - entropy_coef * entropy.mean()
    metrics["actor_loss"] = loss.item()
    return loss, metrics


# --- replay buffer and the critic bundle ---------------------------------------------------------
def episode_transitions(ep, num_actions: int, bootstrap_truncated: bool = True) -> list[tuple]:
    """(s_t, a_t, r_t, s_{t+1}, done_t) per turn; a malformed turn gets action ``num_actions``;
    done_t = 1 at the last turn unless the episode was truncated and ``bootstrap_truncated``.
    a_t is ``ep.action_ids[t]`` (symbolic policies) or else the action index the environment
    parsed from the text, ``ep.infos[t]["action"]`` when it is an int (TwentyQuestions; LM
    episodes)."""
    out = []
    T = len(ep)
    for t in range(T):
        if ep.action_ids is not None:
            a = ep.action_ids[t]
        else:
            a = ep.infos[t].get("action") if ep.infos and t < len(ep.infos) else None
            a = a if isinstance(a, (int, np.integer)) and not isinstance(a, bool) else None
        if a is None or not ep.valid[t]:
            a = num_actions
        s2 = ep.state_keys[t + 1] if t + 1 < T else ep.next_state_key
        last = t == T - 1
        done = last and not (ep.truncated and bootstrap_truncated)
        out.append((ep.state_keys[t], int(a), float(ep.rewards[t]), s2, float(done)))
    return out


def turn_contexts(ep) -> list:
    """The token ids an LM saw before each turn's action, ``prompt_ids + token_ids[:start_t]``
    (``turn_spans``), (T,); ``[None] * T`` for an episode without tokens (a symbolic policy)."""
    if ep.token_ids is None or ep.turn_spans is None:
        return [None] * len(ep)
    return [list(ep.prompt_ids) + list(ep.token_ids[:start]) for start, _ in ep.turn_spans]


class ReplayBuffer:
    """Turn transitions (s, a, r, s', done), uniform sampling, oldest dropped at ``capacity``.
    Beside each, the LM's context of the turn (``turn_contexts``; None for a symbolic policy),
    the state an LM actor replays with a fresh action (``lm_train``)."""

    def __init__(self, capacity: int = 100_000):
        self.data: deque = deque(maxlen=capacity)
        self.contexts: deque = deque(maxlen=capacity)

    def __len__(self) -> int:
        return len(self.data)

    def add(self, transitions, contexts=None) -> None:
        transitions = list(transitions)
        self.data.extend(transitions)
        self.contexts.extend([None] * len(transitions) if contexts is None else contexts)

    def sample(self, batch_size: int, rng: np.random.Generator) -> list[tuple]:
        idx = rng.integers(len(self.data), size=batch_size)
        return [self.data[i] for i in idx]

    def sample_with_contexts(self, batch_size: int,
                             rng: np.random.Generator) -> tuple[list[tuple], list]:
        """``sample``'s draw (the same generator calls), with each transition's context."""
        idx = rng.integers(len(self.data), size=batch_size)
        return [self.data[i] for i in idx], [self.contexts[i] for i in idx]


class ArcherCritic:
    """The online critic, its target copy, their optimizer and the replay buffer.

    ``add(episodes)`` stores turns; ``update(n, policy_probs)`` takes n TD steps, each followed by a
    soft target update; ``advantages(keys, actions)`` gives A = min Q - min V of the online net.
    """

    def __init__(self, num_actions: int, cfg: ArcherConfig | None = None, features=None,
                 feature_dim: int | None = None, rng: np.random.Generator | None = None):
        self.cfg = cfg or ArcherConfig()
        self.num_actions = num_actions
        self.net = TurnCritic(num_actions, features, feature_dim, self.cfg.hidden,
                              self.cfg.num_critics)
        self.target = self.net.copy()
        if self.cfg.critic_optimizer == "adam":
            self.opt = torch.optim.Adam(self.net.parameters(), lr=self.cfg.critic_lr)
        elif self.cfg.critic_optimizer == "sgd":
            self.opt = torch.optim.SGD(self.net.parameters(), lr=self.cfg.critic_lr)
        else:
            raise ValueError(f"critic_optimizer must be 'adam' or 'sgd', got "
                             f"{self.cfg.critic_optimizer!r}")
        self.buffer = ReplayBuffer(self.cfg.capacity)
        self.rng = rng if rng is not None else np.random.default_rng(self.cfg.seed)

    def add(self, episodes) -> None:
        for ep in episodes:
            self.buffer.add(episode_transitions(ep, self.num_actions, self.cfg.bootstrap_truncated),
                            turn_contexts(ep))

    def loss(self, batch, policy_probs=None, v_batch=None) -> tuple[Tensor, dict]:
        """Sum over members of MSE(Q_e(s,a), y_e) + MSE(V_e(s), E_pi Q_e^targ(s, .)).

        The V term: on the batch's states, with ``policy_probs(keys) -> (B, A)`` the exact
        expectation, else Q_e^targ(s, a) of the logged action; or, with ``v_batch`` = (keys,
        actions), on those states with Q_e^targ(s, a_pi) of their given actions (one fresh
        sample of the current policy each: the reference's ``critic_loss``, ``lm_train``)."""
        s, a, r, s2, done = zip(*batch)
        dev = self.net.device
        a = torch.tensor(a, dtype=torch.long, device=dev)  # (B,)
        r = torch.tensor(r, dtype=torch.float32, device=dev)  # (B,)
        done = torch.tensor(done, dtype=torch.float32, device=dev)  # (B,)
        q, v = self.net(list(s))  # (B, E, A+1), (B, E)
        with torch.no_grad():
            _, v_next = self.target(list(s2))  # (B, E)
            y = td_targets(r, done, v_next, self.cfg.gamma)  # (B, E)
            if v_batch is None:
                q_targ, _ = self.target(list(s))  # (B, E, A+1)
                probs = None if policy_probs is None else \
                    torch.as_tensor(policy_probs(list(s)), device=dev)
                yv = v_targets(q_targ, probs, a)  # (B, E)
            else:
                q_targ, _ = self.target(list(v_batch[0]))  # (P, E, A+1)
                yv = v_targets(q_targ, None, torch.as_tensor(v_batch[1], dtype=torch.long,
                                                             device=dev))  # (P, E)
        if v_batch is not None:
            _, v = self.net(list(v_batch[0]))  # (P, E)
        q_a = q.gather(-1, a.view(-1, 1, 1).expand(-1, q.shape[1], 1)).squeeze(-1)  # (B, E)
        q_loss = ((q_a - y) ** 2).mean(0).sum()
        v_loss = ((v - yv) ** 2).mean(0).sum()
        return q_loss + v_loss, {"q_loss": q_loss.item(), "v_loss": v_loss.item(),
                                 "q_mean": q_a.mean().item(), "v_mean": v.mean().item()}

    def update(self, num_steps: int, policy_probs=None, v_batch=None) -> dict:
        """``num_steps`` TD steps on batches from the buffer (V term: ``loss``), each followed by
        a soft target update; the last step's metrics."""
        metrics = {}
        for _ in range(num_steps):
            loss, metrics = self.loss(self.buffer.sample(self.cfg.batch_size, self.rng),
                                      policy_probs, v_batch)
            optimizer_step(self.opt, loss, self.cfg.max_grad_norm)
            soft_update(self.target, self.net, self.cfg.tau)
        return metrics

    @torch.no_grad()
    def advantages(self, keys, actions) -> Tensor:
        q, v = self.net(list(keys))
        return advantages_from_critic(q, v, torch.as_tensor(actions, dtype=torch.long,
                                                            device=self.net.device))

    @torch.no_grad()
    def values(self, keys) -> tuple[Tensor, Tensor]:
        """(min_e Q_e(s, .) (B, A+1), min_e V_e(s) (B,))."""
        q, v = self.net(list(keys))
        return q.min(1).values, v.min(1).values


def fit_critic(episodes, num_actions: int, cfg: ArcherConfig | None = None, features=None,
               feature_dim: int | None = None, num_steps: int = 500,
               policy_probs=None) -> ArcherCritic:
    """A fresh ArCHer critic trained by ``num_steps`` TD steps on ``episodes`` (e.g. for scoring
    against exact A*). With ``policy_probs=None`` the V target uses the logged actions, so it
    estimates the behaviour policy's values."""
    critic = ArcherCritic(num_actions, cfg, features, feature_dim)
    critic.add(episodes)
    critic.update(num_steps, policy_probs)
    return critic


def key_critic(env, cfg: ArcherConfig | None = None,
               rng: np.random.Generator | None = None) -> ArcherCritic:
    """An ArCHer critic over the environment's dense key features (``env.key_features``): with
    ``cfg.hidden`` > 0 the reference's MLP per head (twin Q over ``len(env.actions) + 1`` columns
    and twin V), generalising across belief states; the target net a frozen copy. Lives on the host
    (CPU), whatever torch's default device."""
    D = len(env.key_features(env.start_key()))
    with torch.device("cpu"):
        return ArcherCritic(len(env.actions), cfg, env.key_features, D, rng)


def lm_credit_fn(critic: ArcherCritic, critic_updates: int, policy_probs=None):
    """The on-batch variant (ours; the reference's actor is ``lm_train``): ArCHer's turn critic as
    a ``credit_fn`` for the one LM loop (``grpo.train(..., credit_fn=)``): on each batch of LM episodes it adds their turns to the replay buffer, takes
    ``critic_updates`` TD steps (each with a soft target update; V target = Q^targ of the logged
    action unless ``policy_probs`` is given) and returns A(s_t, a_t) = min_e Q_e - min_e V_e of
    each turn from the updated online critic, (T_i,) per episode; the loop spreads each over its
    turn's tokens. The last critic metrics are kept in ``fn.metrics`` (one dict per call)."""
    def fn(episodes) -> list[np.ndarray]:
        critic.add(episodes)
        fn.metrics.append(critic.update(critic_updates, policy_probs))
        return archer_advantages(episodes, critic)

    fn.critic, fn.metrics = critic, []
    return fn


def archer_advantages(episodes, critic: ArcherCritic) -> list[np.ndarray]:
    """A(s_t, a_t) = min_e Q_e(s_t, a_t) - min_e V_e(s_t) for every turn: (T_i,) per episode, the
    shape of the estimators in ``credit.py`` (a malformed turn uses the extra action column)."""
    out = []
    for ep in episodes:
        if len(ep) == 0:
            out.append(np.zeros(0))
            continue
        a = [x for _, x, _, _, _ in episode_transitions(ep, critic.num_actions)]
        out.append(critic.advantages(ep.state_keys[:len(ep)], a).double().numpy())
    return out


def token_advantages(episodes, critic: ArcherCritic) -> list[Tensor]:
    """The LM level: each turn's advantage on every one of its action tokens, 0 elsewhere."""
    return credit.to_token_advantages(episodes, archer_advantages(episodes, critic))


# --- the LM actor: replayed states, fresh actions (the reference's ArcherTrainer.update) ---------
def turn_logps(model, contexts: list[list[int]], actions: list[list[int]], pad_id: int) -> Tensor:
    """log pi(a | context) = the sum of the action's token log-probs (the reference's
    ``get_log_prob``), with gradients: contexts left-padded as prompts, actions right-padded as
    completions, ``rollout.sequence_logps`` (the packed pass: no padding inside a row). (B,)."""
    B, P, T = len(contexts), max(len(c) for c in contexts), max(len(a) for a in actions)
    prompt_ids = torch.full((B, P), pad_id, dtype=torch.long, device="cpu")
    prompt_mask = torch.zeros(B, P, dtype=torch.long, device="cpu")
    ids = torch.full((B, T), pad_id, dtype=torch.long, device="cpu")
    mask = torch.zeros(B, T, dtype=torch.long, device="cpu")
    for i, (c, a) in enumerate(zip(contexts, actions)):
        prompt_ids[i, P - len(c):] = torch.tensor(c, dtype=torch.long, device="cpu")
        prompt_mask[i, P - len(c):] = 1
        ids[i, :len(a)] = torch.tensor(a, dtype=torch.long, device="cpu")
        mask[i, :len(a)] = 1
    dev = model_device(model)
    logps, _ = sequence_logps(model, prompt_ids.to(dev), prompt_mask.to(dev), ids.to(dev),
                              mask.to(dev))  # (B, T), 0 off the action
    return logps.sum(-1)  # (B,)


def fresh_actions(model, tokenizer, contexts, parse, num_actions: int, max_new_tokens: int,
                  temperature: float, generator) -> tuple[list[list[int]], list[int]]:
    """a ~ pi(.|context) for each replayed context (``rollout.sample_turns``): (token rows, the
    critic's action column of each: ``parse(text)`` -> index or None, None -> ``num_actions``,
    the malformed column)."""
    rows, texts = sample_turns(model, tokenizer, [list(c) for c in contexts], max_new_tokens,
                               temperature, generator)
    cols = []
    for text in texts:
        a = parse(text)
        cols.append(num_actions if a is None else int(a))
    return rows, cols


def lm_actor_step(model, tokenizer, critic: ArcherCritic, optimizer, cfg: ArcherConfig, parse,
                  max_new_tokens: int, temperature: float = 1.0, generator=None) -> dict:
    """One ArCHer actor step of an LM (the reference's actor epoch, ``ArcherTrainer.update``):
    ``actor_batch_size`` states from the replay buffer (their contexts), a fresh a ~ pi(.|s)
    each, A = min_e Q_e(s, a) - min_e V_e(s) from the online critic (no gradient), then one step
    on -mean(log pi(a|s) A) with log pi(a|s) the sum of the action's token log-probs."""
    batch, contexts = critic.buffer.sample_with_contexts(cfg.actor_batch_size or cfg.batch_size,
                                                         critic.rng)
    model.eval()
    rows, cols = fresh_actions(model, tokenizer, contexts, parse, critic.num_actions,
                               max_new_tokens, temperature, generator)
    adv = critic.advantages([tr[0] for tr in batch], cols)  # (B,)
    model.train()
    logps = turn_logps(model, contexts, rows, tokenizer.pad_token_id)  # (B,)
    loss, metrics = actor_loss(logps, adv.to(logps.device, logps.dtype))
    metrics["grad_norm"] = optimizer_step(optimizer, loss, cfg.max_grad_norm)
    metrics["fresh_invalid"] = float(np.mean([a == critic.num_actions for a in cols]))
    model.eval()
    return metrics


def lm_train(model, tokenizer, sample, critic: ArcherCritic, cfg: ArcherConfig, parse,
             max_new_tokens: int, temperature: float = 1.0, evaluate=None, logger=None,
             initial_eval: dict | None = None, on_step=None) -> list[dict]:
    """ArCHer with an LM actor, on ``loop.run`` (the reference's ``offpolicy_train_loop`` with
    ``ArcherTrainer.update``). Each round: ``sample(model, it)`` (``grpo.episode_sampler``: the
    same rollouts as any LM arm) into the replay buffer with each turn's context; with
    ``cfg.v_target='policy'`` ``cfg.v_samples`` replayed states get one fresh action of the
    current policy each, the V term of every TD step (V_e(s) <- Q_e^targ(s, a_pi)); else the
    logged action's; ``cfg.critic_updates`` TD steps; after ``cfg.warmup_iters`` rounds,
    ``cfg.actor_updates`` actor steps (``lm_actor_step``) with AdamW at ``cfg.actor_lr`` (no
    weight decay). The rollout batch itself is never trained on by the actor. ``parse(text)``:
    the critic's action index of a text or None. Returns the rows (``losses/*``: the last critic
    and actor steps')."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.actor_lr, weight_decay=0.0)
    generator = token_generator(model, 10**6 + cfg.seed)  # apart from the sampler's draws

    def update_fn(batch, it: int) -> dict:
        critic.add(batch.episodes)
        v_batch = None
        if cfg.v_target == "policy":
            pool, contexts = critic.buffer.sample_with_contexts(cfg.v_samples, critic.rng)
            _, cols = fresh_actions(model, tokenizer, contexts, parse, critic.num_actions,
                                    max_new_tokens, temperature, generator)
            v_batch = ([tr[0] for tr in pool], cols)
        elif cfg.v_target != "logged":
            raise ValueError(f"v_target must be 'policy' or 'logged', got {cfg.v_target!r}")
        row = {f"losses/{k}": v for k, v in critic.update(cfg.critic_updates, None,
                                                          v_batch).items()}
        if it >= cfg.warmup_iters:
            for _ in range(cfg.actor_updates):
                row.update({f"losses/{k}": v for k, v in lm_actor_step(
                    model, tokenizer, critic, optimizer, cfg, parse, max_new_tokens,
                    temperature, generator).items()})
        return row

    return loop.run(model, sample, update_fn, cfg.num_iters, evaluate=evaluate,
                    eval_every=cfg.eval_every, initial_eval=initial_eval, logger=logger,
                    on_step=on_step, desc="archer-lm")


# --- the training loop (non-LM actor) -------------------------------------------------------------
def actor_step(policy, critic: ArcherCritic, optimizer, cfg: ArcherConfig,
               rng: np.random.Generator) -> dict:
    """One ArCHer actor step: states from the replay buffer, a fresh a ~ pi(.|s), and REINFORCE
    with A(s, a) from the online critic. ``policy.probs(keys)`` -> (B, A) with gradients."""
    batch = [tr for tr in critic.buffer.sample(cfg.batch_size, rng)
             if cfg.actor_actions == "fresh" or tr[1] < critic.num_actions]
    keys = [tr[0] for tr in batch]
    probs = policy.probs(keys)  # (B, A)
    with torch.no_grad():
        if cfg.actor_actions == "fresh":
            a = torch.multinomial(probs.detach().float(), 1).squeeze(-1)  # (B,)
        else:
            a = torch.tensor([tr[1] for tr in batch], dtype=torch.long)  # (B,)
        adv = critic.advantages(keys, a)  # (B,)
    logp_all = torch.log(probs + 1e-12)  # (B, A)
    logps = logp_all.gather(-1, a[:, None]).squeeze(-1)  # (B,)
    entropy = -(probs * logp_all).sum(-1)  # (B,)
    loss, metrics = actor_loss(logps, adv.to(logps.dtype), entropy, cfg.entropy_coef)
    optimizer_step(optimizer, loss, cfg.max_grad_norm)
    return metrics


def train(make_env, policy, cfg: ArcherConfig, train_seeds, num_actions: int | None = None,
          features=None, feature_dim: int | None = None, evaluate=None, logger=None,
          initial_eval: dict | None = None, on_step=None) -> tuple[list[dict], ArcherCritic]:
    """ArCHer with a non-LM actor (``policy.act`` for ``play_episodes``, ``policy.probs(keys)``),
    on ``loop.run``.

    Each round: play ``episodes_per_iter`` episodes with the current policy into the replay
    buffer; ``critic_updates`` TD steps (V target = E_pi Q^targ under the current policy);
    after the warm-up, ``actor_updates`` actor steps on replayed states. Returns (rows, critic);
    rows match ``agent_pg.train``'s (iter, episodes, rollout/*, losses/* of the last critic and
    actor steps, eval/*).
    """
    rng = np.random.default_rng(cfg.seed)
    torch.manual_seed(cfg.seed)
    if num_actions is None:
        num_actions = len(make_env().actions)
    critic = ArcherCritic(num_actions, cfg, features, feature_dim, rng)
    optimizer = torch.optim.Adam(policy.parameters(), lr=cfg.actor_lr)

    def policy_probs(keys):
        with torch.no_grad():
            return policy.probs(keys)

    def sample_fn(policy, it: int) -> agent_pg.EpisodeBatch:
        seeds = rng.choice(np.asarray(train_seeds), size=cfg.episodes_per_iter)
        episodes = play_episodes(make_env, policy.act, [int(s) for s in seeds], 1)
        return agent_pg.EpisodeBatch(episodes, {"episodes": (it + 1) * len(episodes),
                                                **episode_stats(episodes, "rollout/")})

    def update_fn(batch: agent_pg.EpisodeBatch, it: int) -> dict:
        critic.add(batch.episodes)
        m = critic.update(cfg.critic_updates, policy_probs if cfg.v_target == "policy" else None)
        row = {f"losses/{k}": v for k, v in m.items()}
        if it >= cfg.warmup_iters:
            for _ in range(cfg.actor_updates):
                row.update({f"losses/{k}": v
                            for k, v in actor_step(policy, critic, optimizer, cfg, rng).items()})
        return row

    rows = loop.run(policy, sample_fn, update_fn, cfg.num_iters, evaluate=evaluate,
                    eval_every=cfg.eval_every, initial_eval=initial_eval, start={"episodes": 0},
                    logger=logger, on_step=on_step, desc="archer")
    return rows, critic
