"""Turn-level credit by name: the one list of multi-turn estimators and the one if/elif that
turns a batch of ``Episode`` records into one advantage per turn, for table and LM agents alike.

``agent_pg.estimate`` (table policies), ``grpo.turn_advantages`` (LM agents) and
``trl_adapter``'s list of what TRL's GRPOTrainer cannot do all read ``TURN_ESTIMATORS``; a new
estimator is a name here and a branch of ``turn_advantages``. The estimators themselves live in
their modules (``credit``, ``salt``, ``hgpo``, ``empg``, ``hiper``), which this module sits above.

What each needs beyond the record (a list of (T_i,) float64 arrays comes back):
- 'reinforce': the episode's undiscounted return on every turn, no baseline.
- 'grpo', 'gigpo', 'salt', 'hgpo', 'empg' (``GROUP_ESTIMATORS``): normalise within the task group
  (``ep.group_id``), with ``norm_adv`` (False: centre only) and ``ddof``.
- 'turn_gae', 'hiper' (``CRITIC_ESTIMATORS``): a critic, a dict state key -> V read at
  ``ep.state_keys`` and ``ep.next_state_key`` (a key never fitted reads 0, so ``{}`` is V = 0).
  It is tabular and Monte-Carlo for both agents: ``credit.fit_critic`` moves V(k) toward the
  return-to-go of every turn taken in k, after each batch's advantages are computed. An LM
  agent's text environment records the true state key of each turn as a table agent's does, so
  its critic is the same table over environment states (not a value head on the LM);
  ``grpo.lm_credit`` keeps one across ``grpo.train``'s updates.
- 'empg': the policy's entropy at each turn, a list of (T_i,) arrays. A table policy gives them
  exactly (``KeyTablePolicy.episode_entropies``); LM episodes record the sampled tokens'
  log-probs but not the entropies, so ``empg.lm_turn_entropies(model, episodes)`` recomputes them
  (one forward pass; ``grpo.lm_credit`` does it at each update).
'hiper' cuts segments by the stage of the state key (``segment_len=None``) or every
``segment_len`` turns, and does not rescale (``norm_adv`` is not passed: HiPER's own flag scales
a critic-based advantage, default off).
"""

from __future__ import annotations

import numpy as np

from agentrl_lib.algorithms import credit, empg, hgpo, hiper, salt

TURN_ESTIMATORS = ("reinforce", "grpo", "gigpo", "turn_gae", "salt", "hgpo", "empg", "hiper")
CRITIC_ESTIMATORS = ("turn_gae", "hiper")  # read a critic V(state key); fit it after each batch
GROUP_ESTIMATORS = ("grpo", "gigpo", "salt", "hgpo", "empg")  # need two or more per group


def critic_values(critic: dict, episodes) -> tuple[list[np.ndarray], list[float]]:
    """V(s_t) of every turn, (T_i,) each, and V of the state after each episode's last turn, read
    from a dict critic (0 for a key it has not seen)."""
    values = [np.array([critic.get(k, 0.0) for k in ep.state_keys]) for ep in episodes]
    last = [critic.get(ep.next_state_key, 0.0) for ep in episodes]
    return values, last


def turn_advantages(episodes, estimator: str, *, gamma: float = 0.95, lam: float = 0.95,
                    omega: float = 1.0, norm_adv: bool = True, ddof: int = 1,
                    hgpo_depth: int = 2, segment_len: int | None = None,
                    critic: dict | None = None, entropies=None, invalid_penalty: float = 0.0,
                    cross_steps: bool = False) -> list[np.ndarray]:
    """One advantage per turn of each episode by ``estimator`` (one of ``TURN_ESTIMATORS``; the
    module docstring says what each reads). gamma: discount of the step returns (GiGPO, SALT,
    HGPO, turn GAE, HiPER); lam: GAE lambda; omega: weight of the step term (GiGPO, HGPO);
    hgpo_depth: HGPO's deepest level K; critic: dict state key -> V ('turn_gae', 'hiper');
    entropies: per episode, the policy's entropy at each turn ('empg'); invalid_penalty,
    cross_steps: verl-agent's per-step scores ('grpo', 'gigpo': ``credit.grpo_broadcast``)."""
    if (invalid_penalty != 0.0 or cross_steps) and estimator not in ("grpo", "gigpo"):
        raise ValueError(f"invalid_penalty and cross_steps are options of 'grpo' and 'gigpo', "
                         f"not of {estimator!r}")
    if estimator == "reinforce":
        return [np.full(len(ep), ep.ret) for ep in episodes]
    if estimator == "grpo":
        return credit.grpo_broadcast(episodes, norm_adv=norm_adv, ddof=ddof,
                                     invalid_penalty=invalid_penalty, cross_steps=cross_steps)
    if estimator == "gigpo":
        return credit.gigpo_advantages(episodes, gamma=gamma, omega=omega, norm_adv=norm_adv,
                                       ddof=ddof, invalid_penalty=invalid_penalty,
                                       cross_steps=cross_steps)
    if estimator == "salt":
        return salt.salt_advantages(episodes, gamma=gamma, norm_adv=norm_adv, ddof=ddof)
    if estimator == "hgpo":
        return hgpo.hgpo_advantages(episodes, gamma=gamma, depth=hgpo_depth, omega=omega,
                                    norm_adv=norm_adv, ddof=ddof)
    if estimator == "empg":
        if entropies is None:
            raise ValueError("estimator 'empg' needs the behaviour policy's entropy at each turn "
                             "(entropies: one (T_i,) array per episode): a table policy's "
                             "episode_entropies; an LM agent: grpo.lm_credit(cfg, model), or "
                             "empg.lm_turn_entropies(model, episodes))")
        return empg.empg_advantages(episodes, entropies, norm_adv=norm_adv, ddof=ddof)
    if estimator in CRITIC_ESTIMATORS:
        if critic is None:
            raise ValueError(f"estimator {estimator!r} needs a critic: a dict state key -> V "
                             "fitted by credit.fit_critic ({} is V = 0); an LM agent trains with "
                             "grpo.lm_credit(cfg), which keeps one across updates")
        values, last = critic_values(critic, episodes)
        if estimator == "hiper":
            seg = (hiper.stage_segments(episodes) if segment_len is None
                   else hiper.fixed_segments(episodes, segment_len))
            return hiper.hiper_advantages(episodes, seg, values, last, gamma=gamma, lam=lam)
        return credit.turn_gae(episodes, values, gamma, lam, last_values=last)
    raise ValueError(f"estimator {estimator!r} has no multi-turn form; choose one of "
                     f"{TURN_ESTIMATORS}")

