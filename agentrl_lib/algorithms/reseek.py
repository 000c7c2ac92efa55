"""ReSeek's instructive process rewards and the path-faithfulness metric, from gold evidence.

Li, Tang, Wang, Li, Chen (2025), "ReSeek: A Self-Correcting Framework for Search Agents with
Instructive Rewards", arXiv:2510.00568 (code github.com/TencentBAC/ReSeek). The agent may call
JUDGE on what it just retrieved; the dense reward decomposes into a **correctness** reward for
retrieving factual information and a **utility** reward for information genuinely useful for the
query, and the JUDGE verdict j_t is rewarded when it agrees with the ground-truth verdict j-hat_t:

    r_t = w_c * c_t + w_u * u_t + w_j * (2 * 1[j_t = j-hat_t] - 1) * 1[turn t is a JUDGE]
          (+ the outcome reward R on the answer turn)

Here (``envs/kg_judge.py`` sets the flags from gold evidence; the paper scores with a reranker
and the answer: our forms are inferred):
- c_t = ``fact_true``: turn t opened a gold document of the chain whose fact is true in the graph
  (a misaligned gold document earns nothing: it retrieved no factual information);
- u_t = ``advanced``: turn t extended the belief's correct prefix (the information was needed: a
  re-read, an out-of-order or a distractor document earns nothing);
- j-hat_t = "useful" iff the judged open advanced the chain (``judge_truth``).

**The released reward** (``released_rewards``; TencentBAC/ReSeek @ d5a8330,
``verl/utils/reward_score/reseek_regex.py``: ``compute_score``, ``compute_content_overlap_reward``,
``extract_information_judge_pairs``) is what the paper's code trains on, and the notebook's main
arm: one number per episode, the outcome plus, for an episode that answered, a verdict term per
(information, verdict) pair: +0.3 for a right verdict (+0.1 more when the answer is right),
-0.6 for a wrong "useful" (Yes), -0.3 for a wrong "useless" (No); a "useful" verdict in an
episode whose answer is right earns 0.4 without checking the information. The verdict's ground
truth is that the information contains the gold answer (``check_label_in_information``: a
case-insensitive substring), the environment's ``states_answer`` flag; an information block is a
valid open (our search lists titles only, the document arrives with open) and pairs with the
first verdict after it. No correctness or utility term: without JUDGE calls it is the outcome.

The dense reward below (``process_rewards``, our reading of the abstract) is a named variant.
``process_rewards`` returns the per-turn rewards (outcome included); ``reseek_advantages`` turns
them into GRPO advantages: ``mode="episode"`` (default; inferred: the paper trains with GRPO on a
rollout's total reward) normalises each episode's total sum_t r_t within its group and
broadcasts it to every turn; ``mode="turn"`` normalises the returns-to-go G_t = sum_{k>=t} r_k of
all the group's turns together (a turn-level variant for comparison).
``path_faithfulness`` is the share of the documents on an episode's evidence path (its opens,
less those JUDGE set aside) that are gold evidence (inferred: the paper's path faithfulness asks
whether the answer rests on the gold evidence).
"""

from __future__ import annotations

import numpy as np

from agentrl_lib.algorithms.credit import (group_normalise_turns, groups_of, normalise_within,
                                          returns_to_go)

MODES = ("episode", "turn")
# reseek_regex.compute_score's defaults (correct_judge_reward, answer_correct_boost,
# wrong_yes_penalty, wrong_no_penalty)
CORRECT_JUDGE, ANSWER_BOOST, WRONG_YES, WRONG_NO = 0.3, 0.1, -0.6, -0.3


def verdict_reward(said_useful: bool, states_answer: bool, answer_correct: bool,
                   correct: float = CORRECT_JUDGE, boost: float = ANSWER_BOOST,
                   wrong_yes: float = WRONG_YES, wrong_no: float = WRONG_NO) -> float:
    """One (information, verdict) pair's term (``compute_content_overlap_reward``'s loop body).

    >>> verdict_reward(True, False, True), verdict_reward(True, True, False)
    (0.4, 0.3)
    >>> verdict_reward(True, False, False), verdict_reward(False, True, True)
    (-0.6, -0.3)
    """
    if said_useful and answer_correct:  # the code checks no information here
        return correct + boost
    if said_useful == states_answer:
        return correct + (boost if answer_correct else 0.0)
    return wrong_yes if said_useful else wrong_no


def judge_pairs(episode) -> list[tuple[bool, bool]]:
    """(said useful, the information states the answer) per valid open followed by a verdict:
    each open pairs with the first JUDGE after it (``extract_information_judge_pairs``: two opens
    before one verdict both pair with it; an open never judged pairs with nothing)."""
    pairs, waiting = [], []
    for info in episode.infos:
        if info.get("valid") and info.get("tool") == "open" and "doc" in info:
            if "states_answer" not in info:
                raise ValueError("the released reward needs KGJudgeEnv's info['states_answer']")
            waiting.append(bool(info["states_answer"]))
        elif info.get("judge") is not None:
            pairs += [(info["judge"] == "useful", s) for s in waiting]
            waiting = []
    return pairs


def answered(episode) -> bool:
    """The episode ended on a valid answer call (``compute_score``: ``answer is not None``)."""
    return bool(episode.infos) and bool(episode.infos[-1].get("valid")) and \
        episode.infos[-1].get("tool") == "answer"


def released_rewards(episodes, **consts) -> list[np.ndarray]:
    """ReSeek's released reward (``reseek_regex.compute_score``), (T_i,) per episode: zeros and,
    on the last turn (the ``naive`` reward manager scores the response's last token),
    R = sum_t (env reward) + 1[answered] * sum over ``judge_pairs`` of ``verdict_reward``.
    The env reward is the outcome (1 for a right answer; the code's base_score; its 1/4 for more
    than ten answer tags has no counterpart). ``consts`` override ``verdict_reward``'s."""
    out = []
    for ep in episodes:
        r = np.zeros(len(ep))  # (T,)
        if len(ep):
            verdicts = sum(verdict_reward(y, s, ep.success, **consts) for y, s in judge_pairs(ep))
            r[-1] = float(np.sum(ep.rewards)) + (verdicts if answered(ep) else 0.0)
        out.append(r)
    return out


def step_flags(episode) -> dict:
    """{'c', 'u', 'j', 'judged'}: (T,) arrays of the correctness flag, the utility flag, the judge
    agreement (+1 right, -1 wrong, 0 no judge) and whether turn t was a valid JUDGE."""
    c, u, j, judged = [], [], [], []
    for info in episode.infos:
        if "fact_true" not in info:
            raise ValueError("process rewards need KGJudgeEnv's step flags (info['fact_true']): "
                             "play the episode in envs.kg_judge.KGJudgeEnv or KGJudgeMenuEnv")
        c.append(float(info["fact_true"]))
        u.append(float(info["advanced"]))
        is_judge = info.get("judge") is not None
        judged.append(is_judge)
        j.append((1.0 if info["judge"] == info["judge_truth"] else -1.0) if is_judge else 0.0)
    return {"c": np.array(c), "u": np.array(u), "j": np.array(j), "judged": np.array(judged, bool)}


def process_rewards(episodes, w_correct: float = 0.2, w_utility: float = 0.2,
                    w_judge: float = 0.1, w_outcome: float = 1.0) -> list[np.ndarray]:
    """r_t = w_outcome * (env reward) + w_correct * c_t + w_utility * u_t + w_judge * j_t, (T_i,)
    per episode. The environment reward is the outcome (``answer_reward`` on a right answer).
    Weights are ours (inferred): the process terms of a perfect 2-hop episode (0.8) stay below one
    outcome, so no process farming beats answering right."""
    out = []
    for ep in episodes:
        f = step_flags(ep)
        r = w_outcome * np.asarray(ep.rewards, dtype=float)  # (T,)
        out.append(r + w_correct * f["c"] + w_utility * f["u"] + w_judge * f["j"])
    return out


def reseek_advantages(episodes, turn_rewards, mode: str = "episode", norm_adv: bool = True,
                      ddof: int = 1, eps: float = 1e-4) -> list[np.ndarray]:
    """GRPO advantages of per-turn rewards (``process_rewards``), (T_i,) per episode.

    episode: A_{i,t} = (R_i - mean_g R) / (std_g R + eps) with R_i = sum_t r_{i,t}, for every t.
    turn:    A_{i,t} = (G_{i,t} - mean_g G) / (std_g G + eps), G_{i,t} = sum_{k>=t} r_{i,k}, the
             mean and std over all turns of the group's episodes.
    Groups are ``episode.group_id``; a group of one or of all-equal values gets 0.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if len(turn_rewards) != len(episodes):
        raise ValueError(f"{len(turn_rewards)} reward arrays for {len(episodes)} episodes")
    for ep, r in zip(episodes, turn_rewards):
        if len(r) != len(ep):
            raise ValueError(f"an episode of {len(ep)} turns got {len(r)} turn rewards")
    if mode == "episode":
        totals = np.array([float(np.sum(r)) for r in turn_rewards])
        adv = normalise_within(totals, groups_of(episodes).values(), norm_adv, ddof, eps)
        return [np.full(len(ep), a) for ep, a in zip(episodes, adv)]
    rtg = [returns_to_go(r, 1.0) for r in turn_rewards]
    return group_normalise_turns(episodes, rtg, norm_adv, ddof, eps)


def path_faithfulness(episode, kept_only: bool = True) -> float:
    """Share of the documents on the episode's evidence path that are gold evidence: its valid
    opens, without those a ``judge(useless)`` set aside when ``kept_only`` (the path the answer
    rests on: under either mask of ``KGJudgeEnv`` a "useless" verdict takes the judged open off
    it, the paper's soft mask by tagging it, the hard one by dropping it; a verdict removes the
    open it judged, not an earlier open of the same document). 0.0 for an episode with no document on
    its path. ``kept_only=False`` is the retrieval precision of every open."""
    docs = []
    for info in episode.infos:
        if info.get("valid") and info.get("tool") == "open" and "doc" in info:
            docs.append(info["doc"])
        elif kept_only and info.get("rejected_doc") is not None:
            last = len(docs) - 1 - docs[::-1].index(info["rejected_doc"])
            docs.pop(last)
    if not docs:
        return 0.0
    gold = set(episode.infos[0]["gold_docs"])
    return float(np.mean([d in gold for d in docs]))


def judge_accuracy(episodes) -> tuple[float, int]:
    """(share of valid JUDGE calls whose verdict matched the ground truth, how many calls)."""
    hits = [info["judge"] == info["judge_truth"] for ep in episodes for info in ep.infos
            if info.get("judge") is not None]
    return (float(np.mean(hits)) if hits else float("nan")), len(hits)
