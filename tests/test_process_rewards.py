"""Process rewards: hand-computed rewards of each design, the telescoping of Delta, Clip's bound,
and the expected rewards of the exact MDP against sampling."""

import numpy as np
import pytest
import torch

from agentrl_lib.envs.chain_steps import ChainSteps
from agentrl_lib.rewards import process as pr

S = torch.tensor([[0.9, 0.2, 0.7, 0.0], [0.4, 0.0, 0.0, 0.0]], dtype=torch.float64)
M = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
OK = torch.tensor([1.0, 0.0])


def test_hand_computed_rewards():
    r, m = pr.process_rewards(S, M, OK, "success")
    assert torch.allclose(r, torch.tensor([[0, 0, 0, 1, 0], [0, 0, 0, 0, 0.]], dtype=torch.float64))
    r, _ = pr.process_rewards(S, M, OK, "prm", alpha=0.5)
    assert torch.allclose(r[0], torch.tensor([0.45, 0.1, 0.35, 1.0, 0], dtype=torch.float64))
    assert torch.allclose(r[1], torch.tensor([0.2, 0, 0, 0, 0], dtype=torch.float64))
    r, _ = pr.process_rewards(S, M, OK, "clip", eta=0.5)
    assert torch.allclose(r[0], torch.tensor([0.0, -0.3, 0.0, 1.0, 0], dtype=torch.float64))
    assert torch.allclose(r[1], torch.tensor([-0.1, 0, 0, 0, 0], dtype=torch.float64))
    r, m = pr.process_rewards(S, M, OK, "delta")
    assert torch.allclose(r[0], torch.tensor([0.7, -0.5, 0.7, 1.0, 0], dtype=torch.float64))
    assert torch.allclose(r[1], torch.tensor([0.4, 0, 0, 0, 0], dtype=torch.float64))
    assert m["rewards/return"] == pytest.approx((1.9 + 0.4) / 2)
    assert m["rewards/steps"] == pytest.approx(2.0)


def test_delta_telescopes_and_clip_is_bounded():
    g = torch.Generator().manual_seed(0)
    B, T = 64, 9
    scores = torch.rand(B, T, generator=g, dtype=torch.float64)
    n = torch.randint(0, T + 1, (B,), generator=g)
    mask = torch.arange(T) < n[:, None]
    success = (torch.rand(B, generator=g) < 0.5).to(torch.float64)
    r, _ = pr.process_rewards(scores, mask, success, "delta", alpha=0.7)
    # the return is alpha * s_0 + success (0 process reward for an episode with no step) ...
    first = torch.where(n > 0, scores[:, 0], torch.zeros(B, dtype=torch.float64))
    assert torch.allclose(r.sum(-1), 0.7 * first + success)
    # ... and the reward-to-go from every step t telescopes to alpha * s_t + success
    g_t = pr.rewards_to_go(r)[:, :T]
    assert torch.allclose(g_t[mask], (0.7 * scores + success[:, None])[mask])
    rc, _ = pr.process_rewards(scores, mask, success, "clip", eta=0.6)
    assert (rc[:, :T][mask] <= 0).all() and (rc.sum(-1) <= success + 1e-12).all()
    rp, _ = pr.process_rewards(scores, mask, success, "prm")
    assert torch.allclose(rp.sum(-1), success + (scores * mask).sum(-1))


def test_synthetic_prm_and_expected_rewards_match_sampling():
    g = torch.Generator().manual_seed(1)
    correct = torch.rand(4000, 6, generator=g) < 0.7
    s = pr.synthetic_prm(correct, 0.9, 0.1)
    assert torch.equal(s == 0.9, correct)
    s = pr.synthetic_prm(correct, 0.9, 0.1, flip_prob=0.2, generator=g)
    flipped = ((s == 0.9) != correct).double().mean().item()
    assert flipped == pytest.approx(0.2, abs=0.01)
    for rt in ("prm", "clip"):
        (rc, rw), first = pr.expected_step_rewards(rt, 0.9, 0.1, 0.2, alpha=1.0, eta=0.5)
        r, _ = pr.process_rewards(s, torch.ones_like(correct), torch.zeros(4000), rt, eta=0.5)
        assert r[:, :6][correct].mean().item() == pytest.approx(rc, abs=0.01)
        assert r[:, :6][~correct].mean().item() == pytest.approx(rw, abs=0.01)
        assert not first
    assert pr.expected_step_rewards("clip", 0.9, 0.1, 0.2) == ((0.2 * -0.4, 0.8 * -0.4), False)
    assert pr.expected_step_rewards("delta", 0.9, 0.1, 0.0, alpha=2.0) == ((1.8, 0.2), True)


@pytest.mark.parametrize("reward_type", pr.REWARD_TYPES)
def test_exact_mdp_return_equals_sampled_per_step_rewards(reward_type):
    """The tabular form's expected return = the mean return of sampled episodes scored by the
    synthetic PRM and ``process_rewards`` (Delta included, through its telescoped form)."""
    env = ChainSteps(2, 6)
    rng = np.random.default_rng(3)
    pi = rng.dirichlet(np.ones(4) * 2, size=env.num_obs)
    (rc, rw), first = pr.expected_step_rewards(reward_type, 0.9, 0.1, 0.1)
    exact = env.expected_return(pi, (rc, rc, rw), 1.0, first)
    ro = env.rollout(pi, 60_000, rng)
    scores = pr.synthetic_prm(torch.as_tensor(ro["correct"]), 0.9, 0.1, 0.1,
                              torch.Generator().manual_seed(4))
    r, _ = pr.process_rewards(scores, torch.as_tensor(ro["turn_mask"]),
                              torch.as_tensor(ro["success"], dtype=torch.float64), reward_type)
    assert r.sum(-1).mean().item() == pytest.approx(exact, abs=0.03)


def test_bad_input():
    with pytest.raises(ValueError, match="unknown reward_type"):
        pr.process_rewards(S, M, OK, "clipped")
    with pytest.raises(ValueError, match="prefix"):
        pr.process_rewards(S, torch.tensor([[0, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool), OK)
    with pytest.raises(ValueError, match="shapes"):
        pr.process_rewards(S, M, torch.ones(3))
    with pytest.raises(ValueError, match="flip_prob"):
        pr.synthetic_prm(M, flip_prob=1.5)
    with pytest.raises(ValueError, match="unknown reward_type"):
        pr.expected_step_rewards("raw")
