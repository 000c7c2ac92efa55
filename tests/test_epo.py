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
    cfg = EPOConfig(entropy_coef=0.1, beta=2.0, window=2, phase="constant")
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
    reg = EPORegulariser(EPOConfig(num_iters=3))
    pol = KeyTablePolicy(4, seed=0)
    rows = agent_pg.train(make_env, pol, cfg, [0, 1], regulariser=reg)
    assert len(reg.history) == 3 and np.isnan(rows[0]["losses/reg_h_bar"])
    assert rows[1]["losses/reg_h_bar"] == pytest.approx(reg.history[0])
    # the first batch of a uniform table has entropy log 4 at every turn
    assert reg.history[0] == pytest.approx(np.log(4))
    assert rows[2]["losses/reg_coef"] == pytest.approx(0.0)  # linear phase down to w_late = 0
