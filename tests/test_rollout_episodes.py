"""rollout's episode builders on a counter small enough to check by hand: ``replay``, ``truncate``
and ``play_episodes`` from replayed prefixes."""

import pytest

from agentrl_lib.rollout import Episode, play_episodes, replay, truncate


class Counter:
    """'up' adds 1, 'stop' ends with reward = the count; the cap ends (truncated) after 4 turns."""

    actions = ["up", "stop"]

    def reset(self, seed=0):
        self.n, self.turn = seed, 0
        return f"n{self.n}"

    def state_key(self):
        return self.n

    def step(self, a):
        self.turn += 1
        if a == "up":
            self.n += 1
        stop, cap = a == "stop", self.turn >= 4
        info = {"valid": True, "state_key": self.n, "truncated": cap and not stop}
        return f"n{self.n}", float(self.n) if stop else 0.0, stop or cap, info


def up(envs, obs):
    return [0] * len(envs)


def test_replay_restores_the_state_after_t_actions():
    env, obs, done = replay(Counter, ["up", 0, "up"], 2, 5)  # an index or the text
    assert (env.state_key(), obs, done) == (7, "n7", False)
    ep = play_episodes(Counter, lambda envs, obs: ["up", "stop"][:len(envs)], [1])[0]
    assert replay(Counter, ep, 1, 1)[1:] == ("n2", False)
    with pytest.raises(ValueError, match="after the episode ended"):
        replay(Counter, ["stop", "up"], 2, 0)


def test_truncate_cuts_after_t_turns():
    ep = Episode.of([0, 1, 2], [0.0, 0.0, 2.0], final_observation="end", next_state_key=2)
    cut = truncate(ep, 2)
    assert (cut.actions, cut.rewards, cut.state_keys, cut.truncated) == (["a"] * 2, [0.0] * 2,
                                                                          [0, 1], True)
    assert (cut.next_state_key, cut.final_observation) == (2, "o")  # the state before turn 2
    whole = truncate(ep, 3)
    assert whole == ep and whole is not ep and not whole.truncated  # ended by the task: a copy
    assert truncate(ep, 0).next_state_key == 0 and len(truncate(ep, 0)) == 0
    with pytest.raises(ValueError):
        truncate(ep, 4)


def test_truncate_cuts_the_token_record_after_turn_t():
    ep = Episode.of([0, 1], [0.0, 1.0], prompt_ids=[9], token_ids=[5, 2, 7, 6, 2],
                    loss_mask=[1, 1, 0, 1, 1], logps=[-1.0, -2.0, 0.0, -3.0, -4.0],
                    turn_spans=[(0, 2), (3, 5)])
    cut = truncate(ep, 1)  # turn 0's action and its end-of-turn; the observation after it dropped
    assert (cut.token_ids, cut.loss_mask, cut.logps, cut.turn_spans) == (
        [5, 2], [1, 1], [-1.0, -2.0], [(0, 2)])


def test_play_episodes_from_prefixes():
    eps = play_episodes(Counter, up, [0, 10], 1, max_turns=3, prefixes=[["up", 0], []])
    assert [ep.actions for ep in eps] == [["up"] * 3, ["up"] * 3]  # the prefix counts to the cap
    assert eps[0].action_ids == [None, 0, 0] and eps[0].state_keys == [0, 1, 2]
    assert [(ep.next_state_key, ep.truncated) for ep in eps] == [(3, True), (13, True)]
    capped = play_episodes(Counter, up, [0], 1, max_turns=2, prefixes=[["up", "up"]])[0]
    assert len(capped) == 2 and capped.truncated  # the policy never acts
    env_cap = play_episodes(Counter, up, [0], 1, prefixes=[["up"]])[0]  # the env's own cap
    assert len(env_cap) == 4 and env_cap.truncated and env_cap.final_observation == "n4"
    with pytest.raises(RuntimeError, match="not deterministic"):
        play_episodes(Counter, up, [0], 1, prefixes=[["stop", "up"]])


def test_prefix_record_holds_the_replayed_conversation_as_untrained_context(tiny_lm):
    """The record SLATE's LM sampler continues: its tokens are the scripted conversation's up to
    and including the current observation (``text_episodes_to_tokens`` of the played episode,
    then that observation), none of them trained, at the replayed env's state."""
    from agentrl_lib.rollout import (observation_text, prefix_record, text_episodes_to_tokens,
                                     token_ids)

    _, tok = tiny_lm
    played = play_episodes(Counter, up, [1], max_turns=2)[0]  # n1 -> n2 -> n3, capped
    env, obs, done = replay(Counter, played, 2, seed=1)
    rec = prefix_record(tok, env, played.observations, played.actions, obs, "", group_id=7)
    full = text_episodes_to_tokens(tok, [truncate(played, 2)], "")[0]
    tail = token_ids(tok, observation_text(tok, obs, ""))
    assert rec.prompt_ids == full.prompt_ids and rec.token_ids == full.token_ids + tail
    assert set(rec.loss_mask) == {0} and rec.turn_spans == [] and len(rec) == 0
    assert rec.state_keys == [3] and rec.group_id == 7 and not done
