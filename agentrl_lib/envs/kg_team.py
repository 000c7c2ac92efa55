"""KGTeamEnv: a two-agent pipeline on ``KGSearchEnv``: a searcher gathers evidence, an answerer
answers from it (the multi-agent search orchestra of Dr. MAS, Feng et al. 2026, arXiv:2602.08847,
at table scale).

One episode is two phases on one inner ``KGSearchEnv`` (``env.env``; every call below is a real
text tool call on it, so the index, the distractors and the alignment knob are the shared ones):

1. **The searcher** picks from a finite menu (``SEARCHER_ACTIONS``):
   ``search_next`` (search the name of the entity it currently believes is next on the chain),
   ``search_other`` (search a random other name: a wasted call), ``open_top`` / ``open_second``
   (open the first / second result of its last search; the second is usually a "Notes on X"
   distractor), ``handoff`` (stop and pass what it gathered to the answerer). Its belief starts at
   e_0 and moves one hop each time it opens the believed entity's document: the next belief is the
   tail that document *states* for the next relation (on a misaligned corpus the document may lie).
   After ``search_turns`` searcher turns the handoff is forced. **Its reward** arrives at the
   handoff: ``evidence_reward`` per gold document it opened (evidence found).
2. **The answerer** sees what was handed over (state key: the relation the question asks last and
   whether the whole chain was read) and answers one name: ``answer_<relation>`` answers the tail
   that the last document read on the chain states for that relation (the subject e_0 when none was
   read). It is right only when the chain is complete, the corpus told the truth and it picked the
   asked relation. **Its reward**: ``answer_reward`` if right (the inner env's ``answer`` call).

The two roles' rewards live on different scales on purpose (evidence counts up to ``hops`` x
``evidence_reward`` against a 0/1 answer): the heterogeneity under which Dr. MAS shows that one
global GRPO baseline misfits each agent.

The protocol is ``envs/protocol.py``'s; ``KGTeamEnv``'s docstring has the menus, rewards,
episode end and info.
"""

from __future__ import annotations

import re

import numpy as np

from agentrl_lib.envs import protocol
from agentrl_lib.envs.kg_search import RELATIONS, KGSearchEnv

ROLES = ("searcher", "answerer")
SEARCHER_ACTIONS = ("search_next", "search_other", "open_top", "open_second", "handoff")


class KGTeamEnv:
    """A searcher agent, then an answerer agent, on one ``KGSearchEnv`` question (module docstring).

    ## Description
    Dr. MAS's two-agent pipeline: ``role`` says whose turn it is; every searcher call is a real text
    tool call on the inner ``self.env``. ``expert_actions()`` is the scripted team.

    ## Actions
    A name in ``actions`` (the searcher's ``SEARCHER_ACTIONS``, then the answerer's
    ``answer_<relation>``) or its index; ``actions_of(role)`` is one role's menu,
    ``action_offset(role)`` its first index. A call from the wrong role's menu, or off both menus,
    is invalid: counted, no state change, no turn used, zero reward.

    ## Observations
    The inner environment's for a call; "Handed over." at the handoff.

    ## Rewards
    The searcher's at the handoff: ``evidence_reward`` per gold document it opened; the answerer's:
    ``answer_reward`` if right. The scales differ on purpose (module docstring).

    ## Episode end
    Terminated: the answerer's answer (``success``: it was right). Never truncated: the handoff is
    forced after ``search_turns`` searcher turns, so ``max_turns`` = search_turns + 1 turns always
    fit; invalid calls use no turn, so a caller caps those (``play_episodes``' max_turns).

    ## Info
    ``protocol.INFO_KEYS`` (state_key starts with the role; ("done",) at the end), the inner env's
    keys on a call, and ``role`` (who acted), ``agent_reward``, ``call`` (None for a handoff),
    ``hops``, ``grounded``, ``gold_docs``, ``evidence``.

    ## Arguments
    search_turns, evidence_reward, answer_reward; the rest are ``KGSearchEnv``'s (its max_turns is
    set to search_turns + 1).

    ## Exact form
    None; the state keys are small (role, hops, hops read, listed / relation, complete).
    """

    roles = ROLES

    def __init__(self, search_turns: int = 6, evidence_reward: float = 1.0,
                 answer_reward: float = 1.0, **kg_kwargs):
        if search_turns < 1:
            raise ValueError(f"search_turns must be >= 1, got {search_turns}")
        if evidence_reward < 0 or answer_reward < 0:
            raise ValueError("evidence_reward and answer_reward must be >= 0")
        kg_kwargs = dict(kg_kwargs)
        kg_kwargs["max_turns"] = search_turns + 1  # the answer always fits after the search phase
        kg_kwargs["answer_reward"] = answer_reward
        self.env = KGSearchEnv(**kg_kwargs)
        self.search_turns, self.evidence_reward = int(search_turns), float(evidence_reward)
        self.answer_reward = float(answer_reward)
        rels = self.env.graph.relations
        self.answerer_actions = tuple(f"answer_{r}" for r in rels)
        self.actions = SEARCHER_ACTIONS + self.answerer_actions
        self.max_turns = self.search_turns + 1  # the searcher's turns, then the one answer
        self.task = None

    # --- menus ------------------------------------------------------------------------------------
    def actions_of(self, role: str) -> tuple:
        if role == "searcher":
            return SEARCHER_ACTIONS
        if role == "answerer":
            return self.answerer_actions
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")

    def action_offset(self, role: str) -> int:
        self.actions_of(role)
        return 0 if role == "searcher" else len(SEARCHER_ACTIONS)

    # --- the belief -------------------------------------------------------------------------------
    def stated_tail(self, doc_id: int, rel: int) -> str | None:
        """The name document ``doc_id`` states as the tail of relation ``rel`` (None if it states
        none: a distractor)."""
        title, body = self.env.index.get(doc_id)
        m = re.search(rf"The {RELATIONS[rel][0]} of {re.escape(title)} is (\w+)\.", body)
        return None if m is None else m.group(1)

    def believed(self) -> str:
        """The name the searcher believes is next on the chain (the answer once every hop is read)."""
        return self._belief[-1]

    def _name_doc(self, name: str) -> int | None:
        try:
            return int(self.env.corpus.entity_doc[self.env.graph.names.index(name)])
        except ValueError:
            return None

    # --- the protocol -----------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> str:
        obs = self.env.reset(seed)
        self.task = self.env.task
        self.seed = self.task["seed"]
        self.role, self.search_turn, self.done = "searcher", 0, False
        self._belief = [self.env.graph.names[self.task["chain"][0]]]
        self.handed = None
        self.num_invalid = 0
        return obs

    def hops_read(self) -> int:
        return len(self._belief) - 1

    def state_key(self) -> tuple:
        if self.role == "searcher":
            want = self._name_doc(self.believed())
            res = self.env.last_results
            listed = int(bool(res) and res[0][0] == want)
            return ("searcher", self.task["hops"], min(self.hops_read(), self.task["hops"]), listed)
        complete = self.hops_read() >= self.task["hops"]
        return ("answerer", self.task["relations"][-1], complete)

    def evidence_found(self) -> int:
        """Gold documents the searcher opened (the inner env's state key)."""
        return len(self.env.state_key()[1])

    def _info(self, role, inner_info, reward, call, valid, success=False, error=None):
        info = dict(inner_info) if inner_info else {"error": error}
        info.update(state_key=None if self.done else self.state_key(), role=role,
                    agent_reward=reward, call=call, valid=valid, success=success, truncated=False,
                    hops=self.task["hops"], grounded=self.task["grounded"],
                    gold_docs=self.task["gold_docs"], evidence=self.evidence_found())
        if self.done:
            info["state_key"] = ("done",)
        return info

    def _handoff(self) -> float:
        self.role = "answerer"
        self.handed = self.evidence_found()
        return self.evidence_reward * self.handed

    def step(self, action):
        if self.task is None:
            raise RuntimeError("call reset() before step()")
        if self.done:
            return "The episode is over.", 0.0, True, self._info(None, None, 0.0, None, False,
                                                                 error="episode over")
        i, role = protocol.menu_index(action, self.actions), self.role
        if i is None or self.actions[i] not in self.actions_of(role):
            self.num_invalid += 1
            error = (f"it is the {role}'s turn" if i is not None else
                     f"unknown action {repr(action)[:40]}: use one of {self.actions}")
            return f"Error: {error}.", 0.0, False, self._info(role, None, 0.0, None, False,
                                                              error=error)
        name = self.actions[i]
        if role == "answerer":
            rel = self.env.graph.relations.index(name[len("answer_"):])
            last = self.task["chain"][0] if self.hops_read() == 0 else None
            if last is None:  # the last chain document read states the tail
                doc = self._name_doc(self._belief[-2])
                said = self.stated_tail(doc, rel)
            else:
                said = self.env.graph.names[last]
            call = f"answer({said})"
            obs, r, _, inner = self.env.step(call)
            self.done = True
            return obs, r, True, self._info(role, inner, r, call, True, inner["success"])
        # the searcher
        self.search_turn += 1
        reward, call, obs, inner = 0.0, None, "Handed over.", None
        if name == "handoff":
            reward = self._handoff()
        else:
            if name == "search_next":
                call = f"search({self.believed()})"
            elif name == "search_other":
                rng = np.random.default_rng([self.seed, self.search_turn, 7])
                names = self.env.graph.names
                call = f"search({names[int(rng.integers(len(names)))]})"
            else:
                res, j = self.env.last_results, 0 if name == "open_top" else 1
                call = f"open(d{res[j][0]})" if len(res) > j else "open()"
            obs, _, _, inner = self.env.step(call)
            if inner["valid"] and inner["tool"] == "open":
                self._advance(self.env.opened[-1])
            if self.search_turn >= self.search_turns:
                reward = self._handoff()
                obs += " Handed over."
        if not (inner is None or inner["valid"]):
            self.num_invalid += 1
        valid = inner is None or inner["valid"]
        return obs, reward, False, self._info(role, inner, reward, call, valid)

    def _advance(self, doc_id: int):
        """Opening the believed entity's document reads a hop: the belief moves to its stated tail."""
        k = self.hops_read()
        if k >= self.task["hops"] or doc_id != self._name_doc(self.believed()):
            return
        tail = self.stated_tail(doc_id, self.task["relations"][k])
        if tail is not None:
            self._belief.append(tail)

    def expert_actions(self) -> list[str]:
        """The scripted team: search the believed entity, open it, hand off once every hop is read;
        the answerer answers the asked relation."""
        if self.role == "answerer":
            return [f"answer_{self.env.graph.relations[self.task['relations'][-1]]}"]
        if self.hops_read() >= self.task["hops"]:
            return ["handoff"]
        if self.state_key()[3]:
            return ["open_top"]
        return ["search_next"]

    def eval_panel(self, n: int = 64):
        return self.env.eval_panel(n)
