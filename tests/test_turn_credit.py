"""The one turn-credit dispatcher (``turn_credit``): the table loop and the LM loop give the same
numbers on the same episodes, and the shared helpers equal the code they replaced."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from agentrl_lib.algorithms import agent_pg, credit, grpo, turn_credit
from agentrl_lib.algorithms.agent_pg import AgentPGConfig
from agentrl_lib.algorithms.grpo import GRPOConfig
from agentrl_lib.core import ESTIMATORS, discounted_returns, grpo_advantages
from agentrl_lib.envs.multiturn import GridAgentEnv
from agentrl_lib.models.policies import KeyTablePolicy
from agentrl_lib.rollout import Episode, lm_rollout


def batch():
    """Two groups of hand-made episodes over (cell, stage) keys: shared states, stage changes, a
    truncated episode, different lengths."""
    def ep(cells, stages, acts, rewards, gid, truncated=False):
        return Episode.of(list(zip(cells, stages)), rewards, gid, action_ids=acts,
                          actions=[f"a{a}" for a in acts], truncated=truncated,
                          next_state_key=(9, stages[-1] + 1))
    return [ep([0, 1, 2], [0, 0, 1], [0, 1, 1], [0.0, 0.0, 1.0], 0),
            ep([0, 1, 3], [0, 0, 1], [0, 2, 0], [0.0, 0.0, 0.0], 0, truncated=True),
            ep([0, 2], [0, 1], [1, 1], [0.0, 1.0], 0),
            ep([0, 1, 2, 2], [0, 0, 1, 1], [0, 1, 3, 1], [0.0, -0.1, 0.0, 1.0], 0),
            ep([5, 6], [0, 0], [2, 2], [0.5, 0.0], 1),
            ep([5], [0], [0], [1.0], 1),
            ep([5, 7, 8], [0, 1, 2], [1, 0, 0], [0.0, 0.0, 0.25], 1, truncated=True)]


def table_policy(episodes):
    pol = KeyTablePolicy(4, seed=0)
    with torch.no_grad():
        pol.logits.normal_(generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ent = pol.episode_entropies(episodes)
    return pol, turn_credit.empg.split_turns(ent, episodes)


@pytest.mark.parametrize("estimator", turn_credit.TURN_ESTIMATORS)
@pytest.mark.parametrize("norm_adv", [True, False])
def test_lm_estimators_equal_the_table_path(estimator, norm_adv):
    """grpo.turn_advantages (LM loop) == agent_pg.estimate (table loop) on the same episodes, for
    every estimator: the critic ('turn_gae', 'hiper') a fitted dict over the state keys, EMPG's
    entropies those of the table policy."""
    eps = batch()
    pol, ents = table_policy(eps)
    critic = credit.fit_critic({}, eps, 0.9, 0.5)
    kw = dict(estimator=estimator, gamma=0.9, lam=0.8, omega=0.5, norm_adv=norm_adv,
              hgpo_depth=1)
    for seg in (None, 2):
        want = agent_pg.estimate(eps, AgentPGConfig(segment_len=seg, **kw), critic, pol)
        got = grpo.turn_advantages(eps, GRPOConfig(group_size=4, segment_len=seg, **kw),
                                   critic=critic, entropies=ents)
        assert [len(a) for a in got] == [len(e) for e in eps]
        assert all(np.array_equal(a, b) for a, b in zip(got, want)), (estimator, seg)


def test_turn_gae_and_hiper_by_hand():
    """turn_gae with V = 0 (an empty critic) is the (gamma lam)-discounted reward to go; hiper
    with one stage per segment cuts the executor's trace at the stage change, and its planner
    turns run the released segment-level GAE (lam_seg = 0.95) across it."""
    eps = batch()[:1]  # rewards (0, 0, 1), stages (0, 0, 1), terminated
    gae = turn_credit.turn_advantages(eps, "turn_gae", gamma=0.9, lam=0.5, critic={})[0]
    assert np.allclose(gae, [0.45 ** 2, 0.45, 1.0])
    crit = {(0, 0): 0.1, (1, 0): 0.2, (2, 1): 0.3}
    hip = turn_credit.turn_advantages(eps, "hiper", gamma=0.9, lam=0.5, critic=crit)[0]
    d = [0.0 + 0.9 * 0.2 - 0.1, 0.0 + 0.9 * 0.3 - 0.2, 1.0 - 0.3]  # delta_t, V = 0 at the end
    # turn 0 opens segment 0 (2 turns): delta^H_0 + 0.9**2 * lam_seg * A^H_1, A^H_1 = d[2]
    assert np.allclose(hip, [d[0] + 0.9 * d[1] + 0.9 ** 2 * 0.95 * d[2], d[1], d[2]])


def test_reinforce_and_mean_only_grpo_on_the_lm_path():
    eps = batch()
    got = grpo.turn_advantages(eps, GRPOConfig(estimator="reinforce"))
    assert [a.tolist() for a in got] == [[e.ret] * len(e) for e in eps]
    mean_only = grpo.turn_advantages(eps, GRPOConfig(estimator="grpo", norm_adv=False))
    rets = np.array([e.ret for e in eps[:4]])
    assert np.allclose([a[0] for a in mean_only[:4]], rets - rets.mean())


def test_config_names_and_errors():
    for name in turn_credit.TURN_ESTIMATORS:
        GRPOConfig(estimator=name)
        AgentPGConfig(estimator=name)
    GRPOConfig(estimator="reinforce", group_size=1)  # single-turn REINFORCE needs no group
    GRPOConfig(estimator="turn_gae", group_size=1)
    with pytest.raises(ValueError, match="group_size"):
        GRPOConfig(estimator="empg", group_size=1)
    eps = batch()
    with pytest.raises(ValueError, match="critic"):
        grpo.turn_advantages(eps, GRPOConfig(estimator="turn_gae"))
    with pytest.raises(ValueError, match="entrop"):
        grpo.turn_advantages(eps, GRPOConfig(estimator="empg"))
    with pytest.raises(ValueError, match="multi-turn"):
        turn_credit.turn_advantages(eps, "rloo")
    with pytest.raises(ValueError, match="lm_credit"):
        grpo.lm_credit(GRPOConfig(estimator="empg"))


def test_lm_credit_keeps_and_fits_its_critic_as_the_table_loop_does():
    """Two batches through lm_credit == agent_pg's order: estimate with the critic so far, then
    fit it on the batch."""
    eps = batch()
    cfg = GRPOConfig(estimator="turn_gae", gamma=0.9, lam=0.8, critic_lr=0.5)
    fn = grpo.lm_credit(cfg)
    critic: dict = {}
    for b in (eps, eps[2:]):
        want = agent_pg.estimate(b, AgentPGConfig(estimator="turn_gae", gamma=0.9, lam=0.8),
                                 critic)
        credit.fit_critic(critic, b, 0.9, 0.5)
        got = fn(b)
        assert all(np.array_equal(a, w) for a, w in zip(got, want))
        assert fn.critic == critic and fn.metrics == {"critic_keys": len(critic)}


def test_lm_credit_empg_reads_the_models_turn_entropies(tiny_lm):
    model, tok = tiny_lm
    make_env = lambda: GridAgentEnv(max_turns=2)  # noqa: E731
    eps = lm_rollout(model, tok, make_env, [0, 1], 2, 2, 4,
                     generator=torch.Generator().manual_seed(0))
    cfg = GRPOConfig(estimator="empg", group_size=2)
    got = grpo.lm_credit(cfg, model)(eps)
    ents = turn_credit.empg.lm_turn_entropies(model, eps)
    want = turn_credit.empg.empg_advantages(eps, ents)
    assert all(np.array_equal(a, w) for a, w in zip(got, want))


def test_grpo_train_builds_lm_credit_for_the_critic_and_entropy_estimators(tiny_lm):
    """``grpo.train`` with 'turn_gae' (or 'hiper', 'empg') and no credit_fn trains through
    ``lm_credit``: its critic is fitted and reported as ``credit/critic_keys``."""
    import copy

    model, tok = tiny_lm
    model = copy.deepcopy(model)
    make_env = lambda: GridAgentEnv(max_turns=2)  # noqa: E731
    for est in ("turn_gae", "empg"):
        cfg = GRPOConfig(estimator=est, num_iters=2, num_prompts=2, group_size=2, max_turns=2,
                         max_new_tokens=4, lr=1e-3)
        rows = grpo.train(model, grpo.episode_sampler(tok, make_env, list(range(6)), cfg), cfg)
        assert [r["iter"] for r in rows] == [1, 2]
        assert all(np.isfinite(r["losses/loss"]) for r in rows)
        assert (rows[-1].get("credit/critic_keys", 0) > 0) == (est == "turn_gae")


def test_trl_unsupported_is_derived_from_the_lists():
    trl_adapter = pytest.importorskip("agentrl_lib.algorithms.trl_adapter")
    want = set(ESTIMATORS) | set(turn_credit.TURN_ESTIMATORS)
    assert set(trl_adapter.UNSUPPORTED_ESTIMATORS) == want - set(trl_adapter.SCALE_REWARDS)


# --- the shared helpers ---------------------------------------------------------------------------
def test_returns_to_go_is_bit_identical_to_core():
    rng = np.random.default_rng(0)
    for T in (0, 1, 2, 7, 30):
        r = rng.normal(size=T)
        for gamma in (0.0, 0.9, 0.95, 1.0):
            want = discounted_returns(torch.tensor(r, dtype=torch.float64)[None], gamma)[0]
            assert np.array_equal(credit.returns_to_go(r, gamma), want.numpy())
            assert np.array_equal(credit.returns_to_go(list(r), gamma),
                                  credit.episode_returns_to_go([Episode.of([0] * T, list(r))],
                                                               gamma)[0])


def test_groups_of_and_normalise_within_equal_a_loop_of_group_normalise():
    rng = np.random.default_rng(1)
    gids = [2, 0, 2, 1, 0, 2, 3]
    eps = [Episode.of([0] * n, [0.0] * n, g) for n, g in zip([1, 2, 3, 1, 2, 2, 1], gids)]
    groups = credit.groups_of(eps)
    assert groups == {2: [0, 2, 5], 0: [1, 4], 1: [3], 3: [6]}
    x = rng.normal(size=len(eps)).round(1)
    for norm_adv in (True, False):
        flat = credit.normalise_within(x, groups.values(), norm_adv, 0, 1e-4)
        for idx in groups.values():
            assert np.array_equal(flat[idx], credit.group_normalise(x[idx], norm_adv, 0, 1e-4))
        turns = [rng.normal(size=len(e)) for e in eps]
        members = [[(i, t) for i in idx for t in range(len(turns[i]))] for idx in groups.values()]
        ragged = credit.normalise_within(turns, members, norm_adv)
        for idx in groups.values():
            z = credit.group_normalise(np.concatenate([turns[i] for i in idx]), norm_adv, 1, 1e-4)
            assert np.array_equal(np.concatenate([ragged[i] for i in idx]), z)
    # the group normalisation is core's
    v = np.array([1.0, 0.0, 0.5, 0.0])
    want = grpo_advantages(torch.tensor(v)[None], eps=1e-4)[0].numpy()
    assert np.allclose(credit.normalise_within(v, [[0, 1, 2, 3]]), want)


def test_lm_path_defaults_unchanged():
    """The four estimators the LM path had keep their numbers with the new fields' defaults."""
    from agentrl_lib.algorithms import hgpo, salt

    eps = batch()
    cfg = GRPOConfig(gamma=0.9, omega=0.5)
    want = {"grpo": credit.grpo_broadcast(eps),
            "gigpo": credit.gigpo_advantages(eps, gamma=0.9, omega=0.5),
            "salt": salt.salt_advantages(eps, gamma=0.9),
            "hgpo": hgpo.hgpo_advantages(eps, gamma=0.9, omega=0.5)}
    for name, w in want.items():
        got = grpo.turn_advantages(eps, replace(cfg, estimator=name))
        assert all(np.array_equal(a, b) for a, b in zip(got, w)), name
