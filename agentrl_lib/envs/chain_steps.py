"""The step MDP of ``ArithmeticChainTask`` (task "chain"): reasoning as a choice of step kinds.

A chain problem ``start 3, +4, *2, -5`` needs ``k = num_steps`` correct steps before its answer.
At each turn the agent writes one step of a kind:

- ``useful`` (0): the next correct step (``3+4=7``): progress j -> j + 1. Once all k steps are
  written there is nothing left to advance, and a "useful" step is a restatement (redundant);
- ``redundant`` (1): a correct but unnecessary step (``so far 7``: restate, re-derive): no
  progress;
- ``wrong`` (2): an incorrect step (``3+4=8``): progress j -> min(j + 1, k), and the answer will
  be wrong (flag w = 1; errors never cancel in these chains, see ``render``);
- ``stop`` (3): answer now. Success iff j = k and w = 0 (all k useful steps, no wrong step).

``max_turns`` caps the episode (the stop counts as a turn): an episode that reaches the cap
without stopping is *truncated*, with no answer, and fails (an LM cut at its token budget).
The answer line is itself a step a PRM scores: as a correct step when the answer is right, as a
wrong one otherwise (``answer_scored``; in the paper every step, the last with the answer, is
scored).

The exact tabular form (``tabular_form``) has the states (t, j, w), t = turns taken < max_turns,
plus three absorbing terminals (correct answer, wrong answer, truncated), so optimal policies and
expected returns are exact (``algorithms.dp``, ``TabularMDP.optimal_q``). A *stationary* policy
sees only the observation o = (j, w) (``obs_index``), as an LM that does not count its own steps:
``occupancy`` evaluates such a policy (or a turn-indexed one) exactly, for many policies at once,
and ``rollout`` samples it. ``render`` writes an episode as the text of a real chain problem.

Step rewards come from ``rewards/process.py`` (a synthetic PRM and the Clip / Delta designs).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from agentrl_lib.envs.tabular import TabularMDP, _finish

ACTIONS = ("useful", "redundant", "wrong", "stop")
USEFUL, REDUNDANT, WRONG, STOP = range(4)
TERMINALS = ("correct", "incorrect", "truncated")


@dataclass
class ChainSteps:
    """The step MDP of a k-step chain with a turn cap. ``num_obs`` = 2 (k + 1) observations."""

    num_steps: int = 3
    max_turns: int = 10

    def __post_init__(self):
        if self.num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {self.num_steps}")
        if self.max_turns < self.num_steps + 1:
            raise ValueError(f"max_turns={self.max_turns} leaves no room for {self.num_steps} "
                             f"steps and the answer (need >= {self.num_steps + 1})")

    # --- indexing -----------------------------------------------------------------------------
    @property
    def num_obs(self) -> int:
        return 2 * (self.num_steps + 1)

    @property
    def num_states(self) -> int:
        return self.max_turns * self.num_obs + len(TERMINALS)

    def obs_index(self, j: int, w: int) -> int:
        return 2 * j + w

    def state_index(self, t: int, j: int, w: int) -> int:
        return t * self.num_obs + self.obs_index(j, w)

    def terminal_index(self, name: str) -> int:
        return self.max_turns * self.num_obs + TERMINALS.index(name)

    def transition(self, j: int, w: int, a: int) -> tuple[int, int]:
        """(j', w') after a non-stop step kind ``a``."""
        if a == USEFUL and j < self.num_steps:
            return j + 1, w
        if a in (USEFUL, REDUNDANT):
            return j, w
        if a == WRONG:
            return min(j + 1, self.num_steps), 1
        raise ValueError(f"transition takes a step kind 0-2, got {a!r} (stop ends the episode)")

    # --- the exact tabular form ---------------------------------------------------------------
    def tabular_form(self, step_reward=(0.0, 0.0, 0.0), success_reward: float = 1.0,
                     first_step_only: bool = False, answer_scored: bool = True) -> TabularMDP:
        """The MDP over (t, j, w) + 3 terminals, gamma = 1.

        R(s, a) = ``step_reward[a]`` for a step of kind a (useful / redundant / wrong; a useful step
        at j = k is paid as redundant), at every turn or, with ``first_step_only``, at t = 0 only
        (the telescoped Delta reward, whose return is the first step's term); R(s, stop) =
        ``success_reward`` * 1[j = k, w = 0], plus, with ``answer_scored``, the answer step's own
        reward: ``step_reward[useful]`` if right, ``step_reward[wrong]`` if not (under the same
        ``first_step_only`` rule). Reaching t = max_turns goes to 'truncated' (reward 0).
        """
        step_reward = [float(x) for x in step_reward]
        if len(step_reward) != 3:
            raise ValueError(f"step_reward needs 3 values (useful, redundant, wrong), "
                             f"got {step_reward}")
        S, A, k = self.num_states, len(ACTIONS), self.num_steps
        P, R = np.zeros((S, A, S)), np.zeros((S, A))
        for t in range(self.max_turns):
            for j in range(k + 1):
                for w in (0, 1):
                    s = self.state_index(t, j, w)
                    done = j == k and w == 0
                    P[s, STOP, self.terminal_index("correct" if done else "incorrect")] = 1.0
                    R[s, STOP] = success_reward * done
                    if answer_scored and (t == 0 or not first_step_only):
                        R[s, STOP] += step_reward[USEFUL] if done else step_reward[WRONG]
                    for a in (USEFUL, REDUNDANT, WRONG):
                        j2, w2 = self.transition(j, w, a)
                        nxt = (self.state_index(t + 1, j2, w2) if t + 1 < self.max_turns
                               else self.terminal_index("truncated"))
                        P[s, a, nxt] = 1.0
                        paid = REDUNDANT if (a == USEFUL and j == k) else a
                        R[s, a] = step_reward[paid] if (t == 0 or not first_step_only) else 0.0
        terminal = np.zeros(S, dtype=bool)
        for name in TERMINALS:
            i = self.terminal_index(name)
            terminal[i], P[i, :, i] = True, 1.0
        init = np.zeros(S)
        init[self.state_index(0, 0, 0)] = 1.0
        names = [f"t{t} j{j} w{w}" for t in range(self.max_turns) for j in range(k + 1)
                 for w in (0, 1)] + list(TERMINALS)
        return _finish(P, R, 1.0, init, terminal, name=f"chain_steps_k{k}_T{self.max_turns}",
                       state_names=names, action_names=list(ACTIONS), max_steps=self.max_turns)

    def stationary_to_states(self, pi_obs) -> torch.Tensor:
        """A stationary policy over observations (O, 4) as a policy over all states (S, 4)."""
        pi_obs = torch.as_tensor(pi_obs, dtype=torch.float64)
        live = pi_obs.repeat(self.max_turns, 1)  # (T * O, 4)
        tail = torch.full((len(TERMINALS), 4), 0.25, dtype=torch.float64)
        return torch.cat([live, tail])

    # --- exact evaluation of policies ---------------------------------------------------------
    def occupancy(self, pi) -> dict:
        """Exact expectations under a stationary policy ``pi`` (..., O, 4) or a turn-indexed one
        (..., T, O, 4), batched over leading dims: success (Pr[correct answer]), truncated
        (Pr[no answer by the cap]), useful / redundant / wrong (expected steps of each kind, a
        useful step at j = k counted as redundant), steps (expected reasoning steps, the chain
        length), turns (steps + Pr[stop]), first (..., 4): the first turn's action distribution.

        A forward pass of the distribution over (j, w) turn by turn; numpy float64.
        """
        pi = np.asarray(pi, dtype=np.float64)
        k, T, O = self.num_steps, self.max_turns, self.num_obs
        timed = pi.ndim >= 3 and pi.shape[-3] == T and pi.shape[-2] == O
        if pi.shape[-2] != O or pi.shape[-1] != 4:
            raise ValueError(f"policy shape {pi.shape}: expected (..., {O}, 4) or "
                             f"(..., {T}, {O}, 4)")
        batch = pi.shape[:-3] if timed else pi.shape[:-2]
        d = np.zeros(batch + (O,))
        d[..., self.obs_index(0, 0)] = 1.0
        names = ("success", "useful", "redundant", "wrong", "stop")
        out = {name: np.zeros(batch) for name in names}
        goal = self.obs_index(k, 0)
        for t in range(T):
            p = pi[..., t, :, :] if timed else pi  # (..., O, 4)
            m = d[..., :, None] * p  # (..., O, 4) probability mass of (o, a) at turn t
            out["success"] += m[..., goal, STOP]
            out["stop"] += m[..., :, STOP].sum(-1)
            out["wrong"] += m[..., :, WRONG].sum(-1)
            done_j = [self.obs_index(k, 0), self.obs_index(k, 1)]
            out["redundant"] += m[..., :, REDUNDANT].sum(-1) + m[..., done_j, USEFUL].sum(-1)
            out["useful"] += m[..., :, USEFUL].sum(-1) - m[..., done_j, USEFUL].sum(-1)
            nd = np.zeros_like(d)
            for j in range(k + 1):
                for w in (0, 1):
                    o = self.obs_index(j, w)
                    for a in (USEFUL, REDUNDANT, WRONG):
                        j2, w2 = self.transition(j, w, a)
                        nd[..., self.obs_index(j2, w2)] += m[..., o, a]
            d = nd
            if t == 0:
                out["first"] = (pi[..., 0, 0, :] if timed else pi[..., 0, :]).copy()
        out["truncated"] = d.sum(-1)
        out["steps"] = out["useful"] + out["redundant"] + out["wrong"]
        out["turns"] = out["steps"] + out["stop"]
        return out

    def expected_return(self, pi, step_reward=(0.0, 0.0, 0.0), success_reward: float = 1.0,
                        first_step_only: bool = False, answer_scored: bool = True):
        """E[return] of ``pi`` (batched as ``occupancy``) under the rewards of ``tabular_form``."""
        occ = self.occupancy(pi)
        r = np.asarray(step_reward, dtype=np.float64)
        if first_step_only:
            # a useful step at t = 0 is a real one (j = 0 < k), so first[:3] pays step_reward as
            # is; an answer at t = 0 is always wrong (k >= 1)
            process = (occ["first"][..., :3] * r).sum(-1)
            if answer_scored:
                process = process + occ["first"][..., STOP] * r[WRONG]
        else:
            process = occ["useful"] * r[0] + occ["redundant"] * r[1] + occ["wrong"] * r[2]
            if answer_scored:
                wrong_answers = occ["stop"] - occ["success"]
                process = process + occ["success"] * r[USEFUL] + wrong_answers * r[WRONG]
        return success_reward * occ["success"] + process

    # --- sampling -----------------------------------------------------------------------------
    def rollout(self, pi, num_episodes: int, rng: np.random.Generator) -> dict:
        """Sample episodes of a stationary policy ``pi`` (O, 4). Returns numpy arrays:
        obs, actions (B, T) (-1 after the end), kinds (B, T): the *paid* kind of each reasoning
        step (0 useful, 1 redundant, 2 wrong; -1 elsewhere, the stop turn included),
        step_mask (B, T) 1 on reasoning steps, num_steps (B,) reasoning steps,
        turn_mask (B, T) 1 on every turn taken (the steps and the answer), correct (B, T) what a
        PRM should judge each turn (useful and redundant steps correct, wrong steps not, the
        answer correct iff it succeeds), stopped, success, truncated (B,), and counts useful /
        redundant / wrong (B,)."""
        pi = np.asarray(pi, dtype=np.float64)
        B, T, k = num_episodes, self.max_turns, self.num_steps
        j, w = np.zeros(B, dtype=int), np.zeros(B, dtype=int)
        alive = np.ones(B, dtype=bool)
        obs = np.full((B, T), -1)
        actions = np.full((B, T), -1)
        kinds = np.full((B, T), -1)
        success = np.zeros(B, dtype=bool)
        stopped = np.zeros(B, dtype=bool)
        cdf = np.cumsum(pi, -1)
        for t in range(T):
            o = 2 * j + w
            a = (rng.random(B)[:, None] > cdf[o]).sum(-1).clip(max=3)  # inverse-cdf sampling
            a = np.where(alive, a, -1)
            obs[:, t] = np.where(alive, o, -1)
            actions[:, t] = a
            stop = alive & (a == STOP)
            success |= stop & (j == k) & (w == 0)
            stopped |= stop
            step = alive & (a != STOP)
            paid = np.where((a == USEFUL) & (j == k), REDUNDANT, a)
            kinds[:, t] = np.where(step, paid, -1)
            adv = step & ((a == USEFUL) & (j < k) | (a == WRONG))
            w = np.where(step & (a == WRONG), 1, w)
            j = np.where(adv, np.minimum(j + 1, k), j)
            alive &= ~stop
        step_mask = kinds >= 0
        turn_mask = actions >= 0
        correct = (kinds == USEFUL) | (kinds == REDUNDANT) | ((actions == STOP) & success[:, None])
        return {"obs": obs, "actions": actions, "kinds": kinds, "step_mask": step_mask,
                "turn_mask": turn_mask, "correct": correct & turn_mask,
                "num_steps": step_mask.sum(-1), "stopped": stopped, "success": success,
                "truncated": ~stopped, "useful": (kinds == USEFUL).sum(-1),
                "redundant": (kinds == REDUNDANT).sum(-1), "wrong": (kinds == WRONG).sum(-1)}

    # --- text ---------------------------------------------------------------------------------
    def render(self, problem: dict, actions) -> str:
        """The text of an episode on a real chain problem (``text_tasks.make_problems("chain",
        n, difficulty=k)``): one step a line, ``answer X`` at a stop. A wrong step adds 1 to the
        value it computes; later steps (+, -, *2, *3) never cancel that error.

        >>> ChainSteps(2, 5).render({"steps": ["+4", "*2"], "values": [3, 7, 14]}, [0, 1, 0, 3])
        '3+4=7\\nso far 7\\n7*2=14\\nanswer 14'
        """
        steps = problem["steps"]
        if len(steps) != self.num_steps:
            raise ValueError(f"problem has {len(steps)} steps, the MDP {self.num_steps}")
        cur, j, lines = problem["values"][0], 0, []
        for a in actions:
            a = int(a)
            if a == STOP:
                lines.append(f"answer {cur}")
                break
            if a == REDUNDANT or (a == USEFUL and j == self.num_steps):
                lines.append(f"so far {cur}")
                continue
            if a not in (USEFUL, WRONG):
                raise ValueError(f"unknown step kind {a!r}; expected 0-3 {ACTIONS}")
            if j == self.num_steps:  # a wrong step after the last: a wrong restatement
                lines.append(f"so far {cur + 1}")
                cur += 1
                continue
            op, v = steps[j][0], int(steps[j][1:])
            new = {"+": cur + v, "-": cur - v, "*": cur * v}[op] + (a == WRONG)
            lines.append(f"{cur}{op}{v}={new}")
            cur, j = new, j + 1
        return "\n".join(lines)


def deterministic_policies(num_obs: int) -> np.ndarray:
    """Every deterministic stationary policy over ``num_obs`` observations, one-hot: (4^O, O, 4)."""
    if num_obs > 10:
        raise ValueError(f"4^{num_obs} policies is too many to enumerate; use num_steps <= 4")
    idx = np.indices((4,) * num_obs).reshape(num_obs, -1).T  # (4^O, O)
    return np.eye(4)[idx]


def best_stationary(env: ChainSteps, step_reward=(0.0, 0.0, 0.0), success_reward: float = 1.0,
                    first_step_only: bool = False, answer_scored: bool = True
                    ) -> tuple[np.ndarray, float, dict]:
    """The exact optimum over deterministic stationary policies (enumerated): (pi (O, 4), its
    expected return, its ``occupancy``). Ties go to the fewest expected reasoning steps, then to
    the first in enumeration order."""
    pols = deterministic_policies(env.num_obs)
    ret = env.expected_return(pols, step_reward, success_reward, first_step_only,
                              answer_scored)  # (N,)
    occ = env.occupancy(pols)
    best = np.flatnonzero(ret >= ret.max() - 1e-9)
    i = int(best[np.argmin(occ["steps"][best])])
    return pols[i], float(ret[i]), {k: v[i] for k, v in occ.items()}
