"""EPO's entropy regulariser: hand-computed penalties, phase weights, the history, the hooks."""

import numpy as np
import pytest
import torch

from agentrl_lib.algorithms import agent_pg, epo
from agentrl_lib.algorithms.agent_pg import AgentPGConfig
from agentrl_lib.algorithms.epo import EPOConfig, EPORegulariser
from agentrl_lib.envs.multiturn import GridAgentEnv
from agentrl_lib.models.policies import KeyTablePolicy


def test_smoothing_penalty_by_hand():
    h = torch.tensor([0.2, 1.0, 2.0], dtype=torch.float64)
    # band around H_bar = 1 with kappa 0.5, 1.5 is [0.5, 1.5]: 0.2 is 0.3 below, 2.0 is 0.5 above
    p, m = epo.smoothing_penalty(h, 1.0, 0.5, 1.5, "hinge")
    assert p.item() == pytest.approx((0.3 + 0.0 + 0.5) / 3)
    assert m == {"below": pytest.approx(1 / 3), "above": pytest.approx(1 / 3)}
    p, _ = epo.smoothing_penalty(h, 1.0, 0.5, 1.5, "outside_abs")
    assert p.item() == pytest.approx((0.8 + 0.0 + 1.0) / 3)
    # inside the band: zero, and zero gradient
    h2 = torch.tensor([0.6, 1.4], dtype=torch.float64, requires_grad=True)
    p, m = epo.smoothing_penalty(h2, 1.0)
    p.backward()
    assert p.item() == 0.0 and torch.all(h2.grad == 0) and m["below"] == m["above"] == 0.0


def test_penalty_gradient_pushes_into_band():
    h = torch.tensor([0.1, 3.0], dtype=torch.float64, requires_grad=True)
    epo.smoothing_penalty(h, 1.0)[0].backward()
    # descent raises the low entropy and lowers the high one, each with slope 1/N
    assert h.grad.tolist() == pytest.approx([-0.5, 0.5])


def test_phase_weight():
    assert [epo.phase_weight(k, 3, "linear", 0.4) for k in range(3)] == pytest.approx([1.0, 0.7, 0.4])
    assert [epo.phase_weight(k, 4, "step", 0.0, 0.5) for k in range(4)] == [1.0, 1.0, 0.0, 0.0]
    assert epo.phase_weight(7, 3, "constant") == 1.0
    assert epo.phase_weight(0, 1, "linear", 0.0) == 1.0  # one iteration: no division by zero
    with pytest.raises(ValueError, match="phase"):
        epo.phase_weight(0, 3, "cosine")


def test_epo_loss_and_history():
    # our variant: the hinge on a window of past batches (the current one excluded)
    cfg = EPOConfig(entropy_coef=0.1, beta=2.0, window=2, phase="constant", penalty="hinge",
                    history="window", kappa_lo=0.5, kappa_hi=1.5)
    reg = EPORegulariser(cfg)
    h0 = torch.tensor([1.0, 1.0], dtype=torch.float64)
    loss, m = reg(h0, 0)  # no history: only the bonus
    assert loss.item() == pytest.approx(-0.1) and m["penalty"] == 0.0
    loss_again, _ = reg(h0 * 0.1, 0)  # a second epoch of iteration 0 adds no history
    assert reg.history == [1.0]
    h1 = torch.tensor([0.2, 1.0], dtype=torch.float64)
    loss, m = reg(h1, 1)  # H_bar = 1 (iteration 0): 0.2 is 0.3 below the band
    assert m["h_bar"] == 1.0
    assert loss.item() == pytest.approx(-0.1 * 0.6 + 2.0 * 0.3 / 2)
    reg(torch.tensor([3.0], dtype=torch.float64), 2)
    reg(torch.tensor([1.0], dtype=torch.float64), 3)
    assert reg.history == pytest.approx([1.0, 0.6, 3.0, 1.0])
    assert reg._h_bar == pytest.approx((0.6 + 3.0) / 2)  # the window: the last two past batches


def test_lm_hook_uses_the_mask():
    reg = EPORegulariser(EPOConfig(entropy_coef=1.0, phase="constant"))
    ent = torch.tensor([[1.0, 5.0], [3.0, 7.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 0], [1, 0]])
    loss, _ = reg.lm(ent, mask, 0)
    assert loss.item() == pytest.approx(-2.0) and reg.history == [2.0]
    with pytest.raises(ValueError, match="same shape"):
        reg.lm(ent, mask[:, :1], 1)


def test_bad_config():
    with pytest.raises(ValueError, match="penalty"):
        EPOConfig(penalty="square")
    with pytest.raises(ValueError, match="kappa"):
        EPOConfig(kappa_lo=1.2)
    with pytest.raises(ValueError, match="non-empty"):
        epo.smoothing_penalty(torch.zeros(0), 1.0)


def test_in_agent_pg_loop():
    tasks = [((0, 0), (2, 2))]
    make_env = lambda: GridAgentEnv(["...", "...", "..."], tasks=tasks, max_turns=6)  # noqa: E731
    cfg = AgentPGConfig(num_iters=3, num_prompts=2, group_size=4, lr=0.1, seed=0)
    reg = EPORegulariser(EPOConfig(num_iters=3, penalty="hinge", history="window", phase="linear",
                                   phase_on="bonus"))
    pol = KeyTablePolicy(4, seed=0)
    rows = agent_pg.train(make_env, pol, cfg, [0, 1], regulariser=reg)
    assert len(reg.history) == 3 and np.isnan(rows[0]["losses/reg_h_bar"])
    assert rows[1]["losses/reg_h_bar"] == pytest.approx(reg.history[0])
    # the first batch of a uniform table has entropy log 4 at every turn
    assert reg.history[0] == pytest.approx(np.log(4))
    assert rows[2]["losses/reg_coef"] == pytest.approx(0.0)  # linear phase down to w_late = 0


# --- the released code's form (WujiangXu/EPO at 5b6fa98, verl/workers/actor/dp_actor.py) -----------
def test_released_phase_weight_by_hand():
    # _calculate_epoch_based_entropy_weight with max_epochs = 10: half = 5
    want = {0: 1.0, 5: 1 - 0.2 * (1 - np.exp(-2.0)),  # 0.827..., the end of the slow half
            6: 0.8 * np.exp(-3 * 1 / 5), 10: 0.8 * np.exp(-3.0), 12: 0.8 * np.exp(-3.0)}
    for k, w in want.items():
        assert epo.released_phase_weight(k, 10) == pytest.approx(w)
    assert epo.phase_weight(6, 10, "released") == pytest.approx(0.8 * np.exp(-0.6))


def test_released_penalty_by_hand_and_no_gradient():
    # H_bar = 1, band (0, 2) strict, rho 0.05: turns 0.0 (on the lower edge), 1.0, 2.0 (on the
    # upper edge), 3.0 are out, in, out, out: P = 0.05 * 3 / 4
    h = torch.tensor([0.0, 1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    p, m = epo.released_penalty(h, 1.0, 0.0, 2.0, 0.05)
    assert p.item() == pytest.approx(0.0375)
    assert m == {"below": pytest.approx(0.25), "above": pytest.approx(0.5)}
    assert not p.requires_grad  # a constant: the code's smoothing term moves no parameter


def test_released_epo_loss_by_hand():
    # the code: policy_loss = pg - c * (mean H - beta * w * P), w on the smoothing term only
    cfg = EPOConfig(num_iters=10)  # defaults: the code's c 0.001, beta 1, band (0, 2), rho 0.1
    h = torch.tensor([0.5, 1.5, 4.0], dtype=torch.float64, requires_grad=True)
    loss, m = epo.epo_loss(h, 1.0, 6, cfg)
    w = 0.8 * np.exp(-0.6)
    assert loss.item() == pytest.approx(-0.001 * 2.0 + 0.001 * 1.0 * w * 0.1 / 3)
    assert m["coef"] == 0.001 and m["smooth_weight"] == pytest.approx(w)
    loss.backward()  # the gradient is the bonus's alone
    assert h.grad.tolist() == pytest.approx([-0.001 / 3] * 3)


def test_released_history_includes_the_current_batch():
    reg = EPORegulariser(EPOConfig(num_iters=4))
    reg(torch.tensor([2.0], dtype=torch.float64), 0)
    assert reg._h_bar == 2.0  # appended before the update (ray_trainer.py l.1109, l.1269)
    reg(torch.tensor([1.0, 3.0], dtype=torch.float64), 1)
    reg(torch.tensor([9.0], dtype=torch.float64), 1)  # a second epoch: no new history
    assert reg.history == [2.0, 2.0] and reg._h_bar == 2.0
    reg(torch.tensor([5.0], dtype=torch.float64), 2)
    assert reg._h_bar == pytest.approx(3.0)  # every batch so far, never forgotten


def test_released_epo_trains_as_the_constant_bonus():
    tasks = [((0, 0), (2, 2))]
    make_env = lambda: GridAgentEnv(["...", "...", "..."], tasks=tasks, max_turns=6)  # noqa: E731

    def run(**kw):
        cfg = AgentPGConfig(num_iters=3, num_prompts=2, group_size=4, lr=0.1, seed=0,
                            entropy_coef=kw.pop("entropy_coef", 0.0))
        pol = KeyTablePolicy(4, seed=0)
        with torch.no_grad():  # a non-uniform start: the entropy has a gradient
            pol.logits.copy_(torch.randn(pol.logits.shape, dtype=pol.logits.dtype,
                                         generator=torch.Generator().manual_seed(0)))
        agent_pg.train(make_env, pol, cfg, [0, 1], **kw)
        return pol.logits.detach().clone()

    bonus = run(entropy_coef=0.001)
    # a narrow band: most turns are out of it
    band = dict(num_iters=3, kappa_lo=0.9, kappa_hi=1.01)
    released = run(regulariser=EPORegulariser(EPOConfig(**band)))
    hinge = run(regulariser=EPORegulariser(EPOConfig(penalty="hinge", **band)))
    assert not torch.allclose(bonus, run(), atol=1e-6)  # the bonus moved the table
    assert torch.allclose(bonus, released, atol=1e-12)
    assert not torch.allclose(bonus, hinge, atol=1e-6)  # a penalty with a gradient moves them
