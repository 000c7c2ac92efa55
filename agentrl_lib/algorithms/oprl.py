"""Online process reward learning: an implicit PRM fitted by trajectory DPO, alternating with the
policy (Liu et al. 2025, "Agentic Reinforcement Learning with Implicit Step Rewards" (iStar),
arXiv:2509.19199; the catalog's ``oprl``).

**The implicit PRM.** A second policy pi_phi over the same (key, action) space; its *implicit step
reward* is the log-ratio to a reference (the rollout policy pi_old in the paper)::

    r_phi(k_t, a_t) = beta * ( log pi_phi(a_t | k_t) - log pi_ref(a_t | k_t) )            (step reward)

**Trajectory DPO.** Within a group (episodes of one task), every pair whose outcomes differ,
R(tau_w) > R(tau_l), is a preference; the PRM is fitted by DPO on the *summed* per-trajectory
log-ratios, i.e. ``dpo.dpo_loss`` with sequence log-probs sum_t log pi_phi(a_t | k_t)::

    L(phi) = - mean_(w, l) log sigma( sum_t r_phi(tau_w)_t - sum_t r_phi(tau_l)_t )          (traj DPO)

so the step rewards are a decomposition of a trajectory-level Bradley-Terry score: their sum
orders trajectories as the outcomes do, and how the sum is split over the steps is what the
table learns across many pairs that share (key, action) steps. The PRM is trained *online*: each
batch, ``num_epochs`` Adam steps on that batch's pairs (warm-started), then the policy update,
then the next batch (the alternation of the paper).

**Advantages.** The episode-level GRPO advantage A^E_i (the outcome normalised in its group, as
``credit.episode_advantages``) plus ``alpha`` times a step-level advantage: the step reward
(or its discounted return-to-go when ``gamma`` > 0) normalised over *all steps of the group's
episodes*::

    A_t = A^E_i + alpha * (r_t - mean(R_s)) / std(R_s),   R_s = {r_phi of every step of the group}

``oprl_advantages`` takes the step rewards as an argument (pure); ``oprl_batch_advantages`` fits a
fresh PRM on the batch alone and returns the advantages (the credit arena's entry, as ArCHer's
critic is fitted there; pass ``policy=`` the behaviour policy for the paper's reference);
``OPRLCredit`` is the stateful ``credit_fn`` for ``agent_pg.train`` and ``grpo.train`` (one PRM
kept across batches).

**Potential-based shaping.** Only sums over whole trajectories enter the DPO loss, so any
r'(k, a) = r(k, a) + Phi(k') - Phi(k) with Phi(start) = Phi(end) (e.g. 0 at both) has the same
loss; the step rewards are identified up to such a potential, which leaves the optimal policy
unchanged (Ng et al. 1999) -- the paper's argument that the implicit step rewards are a shaping of
the outcome reward.

Taken from the paper: the log-ratio step reward with pi_old as reference, the trajectory-level
DPO objective on outcome preferences of one task's rollouts, the alternation PRM update / policy
update, A = A^E + alpha A^S with A^S the step reward normalised over the group's steps, alpha = 1.
Inferred (written when the paper's repository held only compiled files; its source,
Tongyi-ConvAI/Tongyi-Character ``CharacterRL-iStar/`` @ dfee104, is compared in
reproductions/fidelity/37_oprl.md): pairs = every (better, worse) pair of a
group; the PRM here is a table of logits over (key, action) (an MLP would do the same) rather than
a copy of the LLM, initialised at the reference's logits where given (else uniform); the immediate
step reward (``gamma = 0``) as the step-level quantity (``gamma`` > 0 gives PRIME's return-to-go
variant); ``beta`` and the PRM's lr and steps per batch.

Conventions follow ``credit.py``: group normalisation with ddof = 1 and eps = 1e-4, exactly 0 for
a group of one or all-equal values; per-episode float64 arrays (T_i,). Tensors live on the cpu.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from agentrl_lib.algorithms import credit
from agentrl_lib.algorithms.dpo import dpo_loss
from agentrl_lib.models.policies import KeyRows
from agentrl_lib.utils import optimizer_step

PAIRINGS = ("all", "best_worst")
REFERENCES = ("uniform", "given")


@dataclass
class OPRLConfig:
    beta: float = 1.0
    """scale of the implicit reward beta * log(pi_phi / pi_ref) (DPO's beta)"""
    alpha: float = 1.0
    """weight of the step-level advantage in A = A^E + alpha A^S (paper: 1)"""
    gamma: float = 0.0
    """discount of the step rewards' return-to-go for A^S; 0: the step reward alone (the paper's
    form, inferred); 1: PRIME's return-to-go"""
    lr: float = 0.1
    """Adam learning rate of the PRM table"""
    num_epochs: int = 20
    """full-batch Adam steps of trajectory DPO per batch"""
    pairs: str = "all"
    """'all': every (better, worse) pair of a group; 'best_worst': one pair per group"""
    norm_adv: bool = True
    """divide by the group std (GRPO); False: mean-centred only"""
    ddof: int = 1
    """std's delta degrees of freedom (credit.py's convention)"""
    eps: float = 1e-4
    """added to the std"""

    def __post_init__(self):
        if self.pairs not in PAIRINGS:
            raise ValueError(f"pairs must be one of {PAIRINGS}, got {self.pairs!r}")
        if self.beta <= 0:
            raise ValueError(f"beta must be > 0, got {self.beta}")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1], got {self.gamma}")
        if self.num_epochs < 0:
            raise ValueError(f"num_epochs must be >= 0, got {self.num_epochs}")


# --- pure pieces ----------------------------------------------------------------------------------
def preference_pairs(episodes, pairs: str = "all") -> tuple[np.ndarray, np.ndarray]:
    """(chosen, rejected) episode indices (P,) each: within each group, every pair (i, j) with
    R_i > R_j ('all'), or the first best against the first worst ('best_worst'). A group whose
    returns are all equal gives no pair.

    >>> from agentrl_lib.rollout import Episode
    >>> eps = [Episode.of(["s"], [1.0]), Episode.of(["s"], [0.0]), Episode.of(["s"], [0.5])]
    >>> [x.tolist() for x in preference_pairs(eps)]
    [[0, 0, 2], [1, 2, 1]]
    """
    if pairs not in PAIRINGS:
        raise ValueError(f"pairs must be one of {PAIRINGS}, got {pairs!r}")
    chosen, rejected = [], []
    for members in credit.groups_of(episodes).values():
        rets = {i: episodes[i].ret for i in members}
        if pairs == "all":
            for i in members:
                for j in members:
                    if rets[i] > rets[j]:
                        chosen.append(i)
                        rejected.append(j)
        else:
            best = max(members, key=lambda i: rets[i])
            worst = min(members, key=lambda i: rets[i])
            if rets[best] > rets[worst]:
                chosen.append(best)
                rejected.append(worst)
    return np.array(chosen, dtype=np.int64), np.array(rejected, dtype=np.int64)


def implicit_step_rewards(logps, ref_logps, beta: float) -> list[np.ndarray]:
    """r_t = beta * (log pi_phi(a_t | k_t) - log pi_ref(a_t | k_t)), per episode (T_i,)."""
    return [beta * (np.asarray(lp, dtype=np.float64) - np.asarray(rp, dtype=np.float64))
            for lp, rp in zip(logps, ref_logps)]


def trajectory_dpo_loss(logps_n: torch.Tensor, ref_logps_n: torch.Tensor, owner_n: torch.Tensor,
                        num_episodes: int, chosen: torch.Tensor, rejected: torch.Tensor,
                        beta: float) -> tuple[torch.Tensor, dict]:
    """Trajectory DPO on flat per-turn log-probs: sum each episode's log pi_phi (N,) and
    log pi_ref (N,) over its turns (``owner_n`` (N,) = episode index of each turn), then
    ``dpo.dpo_loss`` (sigmoid) on the (chosen, rejected) pairs (P,). Returns (mean loss, metrics)."""
    seq = torch.zeros(num_episodes, dtype=logps_n.dtype).index_add(0, owner_n, logps_n)  # (B,)
    ref = torch.zeros(num_episodes, dtype=ref_logps_n.dtype).index_add(0, owner_n, ref_logps_n)  # (B,)
    losses, metrics = dpo_loss(seq[chosen], seq[rejected], ref[chosen], ref[rejected], beta=beta)  # (P,)
    return losses.mean(), metrics


def step_level_advantages(episodes, step_rewards, gamma: float = 0.0, norm_adv: bool = True,
                          ddof: int = 1, eps: float = 1e-4) -> list[np.ndarray]:
    """A^S_t: the step reward (or its return-to-go with ``gamma`` > 0) normalised over all steps
    of the episode's group, (T_i,) per episode; 0 for a group whose values are all equal."""
    if len(step_rewards) != len(episodes):
        raise ValueError(f"step_rewards has {len(step_rewards)} entries for {len(episodes)} episodes")
    values = []
    for ep, r in zip(episodes, step_rewards):
        r = np.asarray(r, dtype=np.float64)
        if len(r) != len(ep):
            raise ValueError(f"step rewards of length {len(r)} for an episode of {len(ep)} turns")
        values.append(credit.returns_to_go(r, gamma) if gamma > 0 else r)
    return credit.group_normalise_turns(episodes, values, norm_adv, ddof, eps)


def oprl_advantages(episodes, step_rewards, alpha: float = 1.0, gamma: float = 0.0,
                    norm_adv: bool = True, ddof: int = 1, eps: float = 1e-4) -> list[np.ndarray]:
    """iStar's combined advantage A_t = A^E_i + alpha * A^S_t (module docstring): A^E the
    undiscounted outcome normalised in its group, A^S ``step_level_advantages`` of the given
    implicit step rewards. (T_i,) float64 per episode."""
    a_e = credit.episode_advantages(episodes, 1.0, norm_adv, ddof, eps)
    a_s = step_level_advantages(episodes, step_rewards, gamma, norm_adv, ddof, eps)
    return [a + alpha * s for a, s in zip(a_e, a_s)]


# --- the implicit PRM -----------------------------------------------------------------------------
def _episode_action_ids(ep, action_index=None) -> list[int]:
    if action_index is not None:
        return [int(action_index(ep, t)) for t in range(len(ep))]
    if ep.action_ids is None or any(a is None for a in ep.action_ids):
        raise ValueError("the implicit PRM needs an action index per turn: episodes without "
                         "action_ids (free-text actions) need action_index=fn(ep, t) -> int")
    return list(ep.action_ids)


class ImplicitPRM:
    """pi_phi(a | k) = softmax(theta[k]): a table of logits over ``num_actions`` actions, one row
    per key (``key='state'``: ``ep.state_keys``; ``'observation'``: ``ep.observations``), rows
    created at first sight with ``init_logits(k)`` (e.g. the policy's logits there: the paper
    starts the PRM from the policy) or zeros (uniform). ``action_index(ep, t) -> int`` maps a
    turn to its action (default ``ep.action_ids``; an LM's free text needs one, e.g. with a
    spare index for unparsable actions)."""

    def __init__(self, num_actions: int, cfg: OPRLConfig | None = None, key: str = "state",
                 init_logits=None, action_index=None):
        if key not in ("state", "observation"):
            raise ValueError(f"key must be 'state' or 'observation', got {key!r}")
        if num_actions < 2:
            raise ValueError(f"num_actions must be >= 2, got {num_actions}")
        self.num_actions, self.cfg, self.key = num_actions, cfg or OPRLConfig(), key
        self.init_logits, self.action_index = init_logits, action_index
        self.rows = KeyRows(owner="ImplicitPRM")
        self.theta = torch.zeros(0, num_actions, dtype=torch.float64, device="cpu")  # (K, A)
        self.opt_state: dict = {}

    def keys_of(self, ep) -> list:
        return list(ep.state_keys) if self.key == "state" else list(ep.observations)

    def _index(self, episodes) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(rows (N,), actions (N,), owner (N,)) of every turn; new keys get rows."""
        new = []
        rows, acts, owner = [], [], []
        for i, ep in enumerate(episodes):
            for k, a in zip(self.keys_of(ep), _episode_action_ids(ep, self.action_index)):
                if not 0 <= a < self.num_actions:
                    raise ValueError(f"action index {a} outside [0, {self.num_actions})")
                if k not in self.rows:
                    new.append(k)
                rows.append(self.rows.row(k))
                acts.append(a)
                owner.append(i)
        if new:
            init = torch.zeros(len(new), self.num_actions, dtype=torch.float64, device="cpu")
            if self.init_logits is not None:
                for j, k in enumerate(new):
                    init[j] = torch.as_tensor(np.asarray(self.init_logits(k), dtype=np.float64))
            self.theta = torch.cat([self.theta, init])
            self.opt_state = {}  # Adam's moments are per row: restart them with the new rows
        as_long = dict(dtype=torch.long, device="cpu")
        return torch.tensor(rows, **as_long), torch.tensor(acts, **as_long), torch.tensor(owner, **as_long)

    def logps(self, episodes) -> list[np.ndarray]:
        """log pi_phi(a_t | k_t) per episode, (T_i,) each."""
        rows, acts, _ = self._index(episodes)
        lp = torch.log_softmax(self.theta[rows], -1).gather(-1, acts[:, None]).squeeze(-1)  # (N,)
        return np.split(lp.numpy(), np.cumsum([len(ep) for ep in episodes])[:-1])

    def fit(self, episodes, ref_logps=None) -> dict:
        """``cfg.num_epochs`` full-batch Adam steps of trajectory DPO on the batch's preference
        pairs (warm start from the current table). ref_logps: per episode log pi_ref(a_t | k_t)
        (T_i,) (the rollout policy's); None: uniform. Returns {'dpo_loss', 'pair_accuracy',
        'num_pairs'} after the fit (loss and accuracy NaN without pairs)."""
        cfg = self.cfg
        rows, acts, owner = self._index(episodes)
        ref = reference_logps(episodes, self.num_actions, ref_logps)
        ref_n = torch.as_tensor(np.concatenate(ref) if ref else np.zeros(0), dtype=torch.float64)  # (N,)
        c, r = preference_pairs(episodes, cfg.pairs)
        if len(c) == 0:
            return {"dpo_loss": float("nan"), "pair_accuracy": float("nan"), "num_pairs": 0}
        chosen, rejected = torch.as_tensor(c), torch.as_tensor(r)
        theta = self.theta.clone().requires_grad_()
        with torch.device("cpu"):
            opt = torch.optim.Adam([theta], lr=cfg.lr)
            if self.opt_state:
                opt.load_state_dict(self.opt_state)
            for _ in range(cfg.num_epochs):
                lp = torch.log_softmax(theta[rows], -1).gather(-1, acts[:, None]).squeeze(-1)  # (N,)
                loss, _ = trajectory_dpo_loss(lp, ref_n, owner, len(episodes), chosen, rejected, cfg.beta)
                optimizer_step(opt, loss)
            self.opt_state = opt.state_dict()
        self.theta = theta.detach()
        with torch.no_grad():
            lp = torch.log_softmax(self.theta[rows], -1).gather(-1, acts[:, None]).squeeze(-1)  # (N,)
            loss, m = trajectory_dpo_loss(lp, ref_n, owner, len(episodes), chosen, rejected, cfg.beta)
        return {"dpo_loss": loss.item(), "pair_accuracy": m["rewards/accuracies"], "num_pairs": len(c)}

    def step_rewards(self, episodes, ref_logps=None) -> list[np.ndarray]:
        """r_t = beta (log pi_phi - log pi_ref) per episode, (T_i,) each."""
        return implicit_step_rewards(self.logps(episodes),
                                     reference_logps(episodes, self.num_actions, ref_logps),
                                     self.cfg.beta)


def reference_logps(episodes, num_actions: int, ref_logps=None) -> list[np.ndarray]:
    """The reference's log pi_ref(a_t | k_t) per episode: ``ref_logps`` checked, or the uniform
    policy's -log(num_actions) on every turn."""
    if ref_logps is None:
        return [np.full(len(ep), -np.log(num_actions)) for ep in episodes]
    if len(ref_logps) != len(episodes):
        raise ValueError(f"ref_logps has {len(ref_logps)} entries for {len(episodes)} episodes")
    out = []
    for ep, rp in zip(episodes, ref_logps):
        rp = np.asarray(rp, dtype=np.float64)
        if rp.shape != (len(ep),):
            raise ValueError(f"ref_logps entry of shape {rp.shape} for an episode of {len(ep)} turns")
        out.append(rp)
    return out


def oprl_batch_advantages(episodes, num_actions: int, beta: float = 1.0, alpha: float = 1.0,
                          gamma: float = 0.0, lr: float = 0.1, num_epochs: int = 100,
                          ref_logps=None, pairs: str = "all", key: str = "state",
                          norm_adv: bool = True, ddof: int = 1, eps: float = 1e-4,
                          action_index=None, policy=None) -> list[np.ndarray]:
    """The credit arena's entry: a *fresh* implicit PRM fitted by trajectory DPO on this batch's
    pairs alone (``num_epochs`` Adam steps), its step rewards, then ``oprl_advantages``.
    (T_i,) float64 per episode.

    The reference, as the paper: ``policy`` = the table policy that sampled the batch
    (``KeyTablePolicy``): pi_ref = pi_old and the PRM starts at its logits, so every step reward
    is 0 before the fit (the arena's call: ``oprl_batch_advantages(batch, 4, policy=behaviour)``).
    Else ``ref_logps`` (per episode log pi_ref(a_t | k_t)) with a uniform PRM start, or neither:
    a uniform reference and start."""
    cfg = OPRLConfig(beta=beta, alpha=alpha, gamma=gamma, lr=lr, num_epochs=num_epochs, pairs=pairs,
                     norm_adv=norm_adv, ddof=ddof, eps=eps)
    init = None
    if policy is not None:
        if ref_logps is not None:
            raise ValueError("give policy or ref_logps, not both")
        if not hasattr(policy, "episode_logps") or not hasattr(policy, "logits"):
            raise ValueError("policy must be a table policy with episode_logps and logits (KeyTablePolicy)")
        ref_logps = policy_ref_logps(policy, episodes)
        init = lambda k: policy.logits[policy.row(k)].detach().cpu().numpy()  # noqa: E731
    prm = ImplicitPRM(num_actions, cfg, key=key, init_logits=init, action_index=action_index)
    prm.fit(episodes, ref_logps)
    return oprl_advantages(episodes, prm.step_rewards(episodes, ref_logps), alpha, gamma,
                           norm_adv, ddof, eps)


def policy_ref_logps(policy, episodes) -> list[np.ndarray]:
    """log pi_old(a_t | k_t) of a table policy with ``episode_logps`` (``KeyTablePolicy``), split
    per episode: the reference of the paper (the policy that sampled the batch)."""
    with torch.no_grad():
        flat = policy.episode_logps(episodes).detach().cpu().numpy()  # (N,)
    return np.split(flat, np.cumsum([len(ep) for ep in episodes])[:-1])


class OPRLCredit:
    """The stateful estimator for the training loops: a ``credit_fn`` for ``agent_pg.train``
    and a ``credit_fn`` for ``grpo.train``. Each call (before the policy's update on the batch):
    fit the kept PRM on the batch's pairs (warm start: the alternation PRM step / policy step),
    then return ``oprl_advantages`` of its step rewards. ``ref``: 'uniform', or 'policy' (pi_old =
    ``policy``, a table policy with ``episode_logps``, read before its update; new PRM rows start
    at the policy's logits, as the paper initialises the PRM from the policy). ``metrics`` (a list,
    one dict per call) is logged by ``grpo.train`` under ``credit/``."""

    def __init__(self, prm: ImplicitPRM, ref: str = "uniform", policy=None):
        if ref not in ("uniform", "policy"):
            raise ValueError(f"ref must be 'uniform' or 'policy', got {ref!r}")
        if ref == "policy":
            if policy is None or not hasattr(policy, "episode_logps"):
                raise ValueError("ref='policy' needs a policy with episode_logps (KeyTablePolicy)")
            if prm.init_logits is None and hasattr(policy, "logits"):
                prm.init_logits = lambda k: policy.logits[policy.row(k)].detach().cpu().numpy()
        self.prm, self.ref, self.policy = prm, ref, policy
        self.metrics: list[dict] = []
        self.last_step_rewards: list[np.ndarray] | None = None

    def __call__(self, episodes) -> list[np.ndarray]:
        cfg = self.prm.cfg
        ref = policy_ref_logps(self.policy, episodes) if self.ref == "policy" else None
        fit = self.prm.fit(episodes, ref)
        r = self.prm.step_rewards(episodes, ref)
        self.last_step_rewards = r
        flat = np.concatenate(r) if r else np.zeros(0)
        self.metrics.append({**fit, "step_reward_mean": float(flat.mean()) if len(flat) else 0.0,
                             "step_reward_std": float(flat.std()) if len(flat) else 0.0})
        return oprl_advantages(episodes, r, cfg.alpha, cfg.gamma, cfg.norm_adv, cfg.ddof, cfg.eps)
