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
    with pytest.raises(ValueError, match="micro_batch"):
        EPOConfig(micro_batch=-1)
    with pytest.raises(ValueError, match="history"):
        EPOConfig(history="per_token")


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
# A verbatim port of the code's pieces (prints dropped, ``self`` removed), to compare with.
def _code_epoch_weight(current_epoch: int, max_epochs: int) -> float:
    # dp_actor.py _calculate_epoch_based_entropy_weight, l.79-121
    import math
    if max_epochs <= 0:
        return 1.0
    current_epoch = max(0, min(current_epoch, max_epochs))
    half_epochs = max_epochs // 2
    if current_epoch <= half_epochs:
        if half_epochs == 0:
            return 1.0
        progress = current_epoch / half_epochs
        lambda_slow = 2.0
        weight = 1.0 - 0.2 * (1 - math.exp(-lambda_slow * progress))
    else:
        remaining_epochs = max_epochs - half_epochs
        if remaining_epochs == 0:
            return 0.8
        progress = (current_epoch - half_epochs) / remaining_epochs
        lambda_fast = 3.0
        weight = 0.8 * math.exp(-lambda_fast * progress)
    return weight


def _code_generate_entropy_penalty(entropy_history, entropy, rollout_step, min_ratio=0.8,
                                   max_ratio=1.2, out_range_penalty=0.1):
    # dp_actor.py generate_entropy_penalty, l.300-352, mask_mode "token" (the README runs')
    if len(entropy_history) == 0:
        return torch.ones_like(entropy)
    rollout_step_int = rollout_step.astype(np.int32) if hasattr(rollout_step, 'astype') else np.array(rollout_step, dtype=np.int32)  # noqa: E501
    avg_entropy_per_sample = entropy_history[rollout_step_int]
    avg_entropy_per_sample = torch.tensor(avg_entropy_per_sample, device=entropy.device, dtype=entropy.dtype)  # noqa: E501
    token_avg_entropy = entropy
    avg_entropy_per_sample = avg_entropy_per_sample.unsqueeze(-1).expand_as(token_avg_entropy)
    lower_bound = avg_entropy_per_sample * min_ratio
    upper_bound = avg_entropy_per_sample * max_ratio
    within_range = (token_avg_entropy > lower_bound) & (token_avg_entropy < upper_bound)
    sample_mask = torch.where(within_range, 0, out_range_penalty)
    num_within_range = within_range.sum().item()
    total_tokens = within_range.numel()
    entropy_mask = sample_mask
    entropy_mask_ratio = num_within_range / total_tokens
    return entropy_mask, entropy_mask_ratio


def _code_history_entry(step_entropy_list, max_steps):
    # ray_trainer.py l.1100-1108: left truncate or left-pad with zeros to env.max_steps
    if len(step_entropy_list) > max_steps:
        step_entropy_list = step_entropy_list[-max_steps:]
    elif len(step_entropy_list) < max_steps:
        step_entropy_list = [0.0] * (max_steps - len(step_entropy_list)) + step_entropy_list
    return step_entropy_list


def _masked_mean(values, mask):  # verl_F.masked_mean, agg_loss's "token-mean"
    return (values * mask).sum() / (mask.sum() + 1e-8)


def _code_update_loss(entropy, response_mask, rollout_step, entropy_history, trainer_epoch, config,
                      smooth=True):
    """dp_actor.py update_policy l.716-832 for one mini-batch of turn rows (B, L), the PG loss
    left out (0): the micro-batches' losses divided by gradient_accumulation and summed, as their
    ``loss.backward()`` calls accumulate. Returns (that sum, the sum of the smoothing values)."""
    entropy_history = np.array(entropy_history)
    micro = config["ppo_micro_batch_size_per_gpu"]
    gradient_accumulation = entropy.shape[0] // micro
    rollout_step_micro_batches = np.array_split(rollout_step, (entropy.shape[0] + micro - 1) // micro)
    total, smooth_total = 0.0, 0.0
    for micro_idx, (ent, mask) in enumerate(zip(entropy.split(micro), response_mask.split(micro))):
        current_micro_rollout_step = rollout_step_micro_batches[micro_idx]
        if smooth:
            max_steps = config.get("max_step", 50)
            should_apply_entropy_smooth = np.any(current_micro_rollout_step >= max_steps // 2)
            if should_apply_entropy_smooth:
                entropy_mask, _ = _code_generate_entropy_penalty(
                    entropy_history, ent, current_micro_rollout_step, config["min_ratio"],
                    config["max_ratio"], config["out_range_penalty"])
                epoch_weight = _code_epoch_weight(trainer_epoch, 150)
                entropy_mask = entropy_mask * epoch_weight
            else:
                entropy_mask = torch.zeros_like(ent)
        pg_loss = 0.0
        entropy_loss = _masked_mean(ent, mask)
        if smooth:
            entropy_penalty_loss = _masked_mean(entropy_mask, mask)
            entropy_loss = entropy_loss - entropy_penalty_loss * config["entropy_smooth_coeff"]
            smooth_total = smooth_total + entropy_penalty_loss / gradient_accumulation
        policy_loss = pg_loss - entropy_loss * config["entropy_coeff"]
        total = total + policy_loss / gradient_accumulation
    return total, smooth_total


def _entropy(logits):  # verl_F.entropy_from_logits
    pd = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - torch.sum(pd * logits, dim=-1)


# the code's config defaults' band (0.8, 1.2), narrower than the README's (0, 2): turns fall out of it
CODE_CFG = dict(ppo_micro_batch_size_per_gpu=2, min_ratio=0.8, max_ratio=1.2,
                out_range_penalty=0.1, entropy_smooth_coeff=1.0, entropy_coeff=0.001)


def test_released_phase_weight_matches_the_code():
    # _calculate_epoch_based_entropy_weight with max_epochs = 10: half = 5
    want = {0: 1.0, 5: 1 - 0.2 * (1 - np.exp(-2.0)),  # 0.827..., the end of the slow half
            6: 0.8 * np.exp(-3 * 1 / 5), 10: 0.8 * np.exp(-3.0), 12: 0.8 * np.exp(-3.0)}
    for k, w in want.items():
        assert epo.released_phase_weight(k, 10) == pytest.approx(w)
    for k in range(0, 160, 7):
        assert epo.released_phase_weight(k, 150) == _code_epoch_weight(k, 150)
    cfg = EPOConfig(num_iters=40)
    assert cfg.phase_length == 150  # the code's hard-coded max_epochs, not the run's length
    assert EPOConfig(num_iters=40, phase_epochs=None).phase_length == 40
    assert EPOConfig(num_iters=40, phase="linear").phase_length == 40


def test_released_penalty_by_hand_and_no_gradient():
    # H_bar = 1, band (0, 2) strict, rho 0.05: turns 0.0 (on the lower edge), 1.0, 2.0 (on the
    # upper edge), 3.0 are out, in, out, out: P = 0.05 * 3 / 4
    h = torch.tensor([0.0, 1.0, 2.0, 3.0], dtype=torch.float64, requires_grad=True)
    p, m = epo.released_penalty(h, 1.0, 0.0, 2.0, 0.05)
    assert p.item() == pytest.approx(0.0375)
    assert m == {"below": pytest.approx(0.25), "above": pytest.approx(0.5)}
    assert not p.requires_grad  # a constant: the code's smoothing term moves no parameter
    # per unit H_bar: 1.0 against (0, 2) is in, 1.0 against (0, 0.8) is out
    p, _ = epo.released_penalty(h[1:2].expand(2), torch.tensor([1.0, 0.4]), 0.0, 2.0, 0.1)
    assert p.item() == pytest.approx(0.05)


def test_step_means_pad_on_the_left_as_the_code():
    h = torch.tensor([1.0, 2.0, 3.0, 5.0], dtype=torch.float64)
    turns = [0, 1, 2, 0]  # an episode of 3 turns, one of 1: step means 3, 2, 3
    got = epo.step_means(h, turns, 5)
    assert got.tolist() == [0.0, 0.0, 3.0, 2.0, 3.0]
    assert got.tolist() == _code_history_entry([3.0, 2.0, 3.0], 5)
    with pytest.raises(ValueError, match="turn indices"):
        epo.step_means(h, [0, 1, 5, 0], 5)


def test_released_smoothing_gate_by_hand():
    # six turn rows, micro-batches of 2: turn indices (0, 1), (24, 25), (3, 4); gate 50 -> 25:
    # only the middle micro-batch is on. H_bar = 1, band (0, 2): 3.0 is out, 1.0 in.
    h = torch.tensor([3.0, 3.0, 3.0, 1.0, 3.0, 3.0], dtype=torch.float64)
    p, m = epo.released_smoothing(h, 1.0, [0, 1, 24, 25, 3, 4], None, 0.0, 2.0, 0.1, 2, 50)
    assert p.item() == pytest.approx((0 + 0.1 * 1 / 2 + 0) / 3)
    assert m["gated"] == pytest.approx(1 / 3) and m["above"] == pytest.approx(5 / 6)
    p_all, _ = epo.released_smoothing(h, 1.0, [0] * 6, None, 0.0, 2.0, 0.1, 0, 0)
    assert p_all.item() == pytest.approx(0.1 * 5 / 6)  # gate off, one micro-batch


def test_released_matches_a_verbatim_port_table():
    """Two iterations of turn rows (a table: one unit per turn) through the code's pieces and
    through EPORegulariser: the same smoothing value, and the same gradient, which is the
    constant bonus's: the released term changes nothing in the update."""
    gen = torch.Generator().manual_seed(0)
    cfg = EPOConfig(max_steps=6, gate_steps=6, micro_batch=2, kappa_lo=0.8, kappa_hi=1.2)
    reg = EPORegulariser(cfg)
    code_hist = []
    for it, lengths in enumerate(([4, 2], [6, 2])):  # iteration 0 shorter: its entry is padded
        turns = np.concatenate([np.arange(n) for n in lengths])
        logits = torch.randn(len(turns), 4, dtype=torch.float64, generator=gen) * 2
        # the code: one response token per turn row; the history appended before the update
        ent_rows = _entropy(logits)
        steps = [float(ent_rows[turns == t].mean()) for t in range(max(lengths))]
        code_hist.append(_code_history_entry(steps, cfg.max_steps))
        z1 = logits.clone().requires_grad_(True)
        code_loss, code_smooth = _code_update_loss(
            _entropy(z1)[:, None], torch.ones(len(turns), 1, dtype=torch.float64), turns,
            np.mean(np.array(code_hist), axis=0), it, dict(CODE_CFG, max_step=6))
        code_loss.backward()
        z2 = logits.clone().requires_grad_(True)
        ours, m = reg(_entropy(z2), it, turns)
        ours.backward()
        z3 = logits.clone().requires_grad_(True)
        (-0.001 * _entropy(z3).mean()).backward()  # the constant bonus
        assert reg.turn_history[-1].tolist() == pytest.approx(code_hist[-1])
        assert 0 < m["gated"] < 1  # the gate let some micro-batches through, not all
        assert m["penalty"] * m["smooth_weight"] == pytest.approx(float(code_smooth), rel=1e-6)
        assert m["penalty"] > 0  # some turns fell out of the band
        assert ours.item() == pytest.approx(code_loss.item(), rel=1e-6)
        # the code's masked mean divides by (count + 1e-8): agreement to ~1e-8 relative
        assert torch.allclose(z1.grad, z2.grad, atol=0, rtol=1e-7)
        assert torch.allclose(z2.grad, z3.grad, atol=1e-15, rtol=1e-9)


def test_released_matches_a_verbatim_port_lm():
    """The LM hook: two conversations of three turns (runs of the loss mask) of 1-3 tokens; the
    code's rows are the turns. Same history, same smoothing value; the code's gradient with and
    without its smoothing term is the same, and so is ours and the constant bonus's."""
    gen = torch.Generator().manual_seed(1)
    mask = torch.tensor([[1, 1, 0, 1, 0, 0, 1, 1, 1, 0],
                         [1, 0, 0, 1, 1, 1, 0, 1, 0, 0]], dtype=torch.float64)
    logits = torch.randn(2, 10, 5, dtype=torch.float64, generator=gen) * 3
    turns, rows = epo.mask_turns(mask)
    assert turns.tolist() == [0, 0, 1, 2, 2, 2, 0, 1, 1, 1, 2]
    assert rows.tolist() == [0, 0, 1, 2, 2, 2, 3, 4, 4, 4, 5]
    cfg = EPOConfig(max_steps=3, gate_steps=4, micro_batch=2, kappa_lo=0.8, kappa_hi=1.2)
    reg = EPORegulariser(cfg)
    # the code's turn rows, right-padded to 3 tokens: (6, 3) entropies and response mask
    spans = [(0, 0, 2), (0, 3, 4), (0, 6, 9), (1, 0, 1), (1, 3, 6), (1, 7, 8)]

    def code_rows(ent):
        out = torch.zeros(6, 3, dtype=ent.dtype)
        rmask = torch.zeros(6, 3, dtype=ent.dtype)
        for r, (b, s, e) in enumerate(spans):
            out[r, :e - s] = ent[b, s:e]
            rmask[r, :e - s] = 1
        return out, rmask

    ent0, rmask = code_rows(_entropy(logits))
    step_turn = np.array([0, 1, 2, 0, 1, 2])
    steps = [float(_masked_mean(ent0[step_turn == t], rmask[step_turn == t])) for t in range(3)]
    hist = np.mean(np.array([_code_history_entry(steps, 3)]), axis=0)
    grads = []
    for smooth in (True, False):
        z = logits.clone().requires_grad_(True)
        ent, _ = code_rows(_entropy(z))
        loss, code_smooth = _code_update_loss(ent, rmask, step_turn, hist, 0,
                                              dict(CODE_CFG, max_step=4), smooth=smooth)
        loss.backward()
        grads.append(z.grad)
        if smooth:
            want_smooth = float(code_smooth)
    assert torch.allclose(grads[0], grads[1], atol=0, rtol=0)  # not one bit of difference
    z2 = logits.clone().requires_grad_(True)
    ours, m = reg.lm(_entropy(z2), mask, 0)
    ours.backward()
    z3 = logits.clone().requires_grad_(True)
    (-0.001 * _masked_mean(_entropy(z3), mask)).backward()
    assert reg.turn_history[0].tolist() == pytest.approx(hist.tolist())
    assert m["penalty"] > 0 and m["gated"] == pytest.approx(2 / 3)
    assert m["penalty"] * m["smooth_weight"] == pytest.approx(want_smooth, rel=1e-6)
    assert torch.allclose(z2.grad, z3.grad, atol=1e-15, rtol=1e-9)


def test_released_needs_turn_indices():
    reg = EPORegulariser(EPOConfig())
    with pytest.raises(ValueError, match="turn index"):
        reg(torch.tensor([1.0]), 0)
    reg.observe([[0, 1, 2], [0]])  # anything with a length per episode
    _, m = reg(torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64), 0)
    assert reg.turn_history[0][-3:].tolist() == [2.5, 2.0, 3.0]  # the step means, padded left
    assert m["gated"] == 0.0  # no turn index reaches 25


def test_released_history_includes_the_current_batch():
    reg = EPORegulariser(EPOConfig(num_iters=4, max_steps=2, gate_steps=0))
    reg(torch.tensor([2.0], dtype=torch.float64), 0, [0])
    assert reg._h_bar.tolist() == [0.0, 2.0]  # appended before the update, padded on the left
    reg(torch.tensor([1.0, 3.0], dtype=torch.float64), 1, [0, 1])
    reg(torch.tensor([9.0, 9.0], dtype=torch.float64), 1, [0, 1])  # a second epoch: no new history
    assert reg.history == [2.0, 2.0] and reg._h_bar.tolist() == [0.5, 2.5]
    reg(torch.tensor([5.0], dtype=torch.float64), 2, [0])
    # every batch so far; the turn-0 batch is padded to the right end: 5.0 joins index 1
    assert reg._h_bar.tolist() == pytest.approx([1 / 3, 10 / 3])


def test_released_epo_trains_as_the_constant_bonus():
    tasks = [((0, 0), (2, 2))]
    make_env = lambda: GridAgentEnv(["...", "...", "..."], tasks=tasks, max_turns=6)  # noqa: E731

    def run(reg=None, **kw):
        cfg = AgentPGConfig(num_iters=3, num_prompts=2, group_size=4, lr=0.1, seed=0, **kw)
        pol = KeyTablePolicy(4, seed=0)
        with torch.no_grad():  # a non-uniform start: the entropy has a gradient
            pol.logits.copy_(torch.randn(pol.logits.shape, dtype=pol.logits.dtype,
                                         generator=torch.Generator().manual_seed(0)))

        def credit(episodes):
            if reg is not None:
                reg.observe(episodes)
            return agent_pg.estimate(episodes, cfg)
        agent_pg.train(make_env, pol, cfg, [0, 1], regulariser=reg, credit_fn=credit)
        return pol.logits.detach().clone()

    bonus = run(entropy_coef=0.001)
    # a narrow band and the gate open from turn 1: most turns are out of it and counted
    band = dict(num_iters=3, kappa_lo=0.9, kappa_hi=1.01, max_steps=6, gate_steps=2,
                micro_batch=4)
    released = EPORegulariser(EPOConfig(**band))
    l_released = run(released)
    hinge = run(EPORegulariser(EPOConfig(penalty="hinge", history="all", **band)))
    assert not torch.allclose(bonus, run(), atol=1e-6)  # the bonus moved the table
    assert torch.allclose(bonus, l_released, atol=1e-12)
    assert len(released.turn_history) == 3
    assert not torch.allclose(bonus, hinge, atol=1e-6)  # a penalty with a gradient moves them
