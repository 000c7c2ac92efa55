"""The one loop frame (``algorithms/loop.py``): its rows, evaluation schedule, ``initial_eval``,
``start`` counters and ``stop``; and that the trainers built on it keep its contract."""

import numpy as np
import pytest
import torch

from agentrl_lib.algorithms import agent_pg, arpo, loop
from agentrl_lib.envs.multiturn import GridAgentEnv
from agentrl_lib.models.policies import KeyTablePolicy
from agentrl_lib.utils import MetricsLogger, grad_norm, optimizer_step


class _Batch:
    def __init__(self, it):
        self.metrics = {"rollout/it": it}


def _counting_model():
    calls = []
    evaluate = lambda m: calls.append(len(calls)) or {"n": len(calls)}  # noqa: E731
    return calls, evaluate


def test_rows_count_updates_and_evaluate_at_start_every_and_last(tmp_path):
    calls, evaluate = _counting_model()
    seen = []
    logger = MetricsLogger(tmp_path)
    rows = loop.run(None, lambda m, it: _Batch(it), lambda b, it: seen.append(it) or {"u": it},
                    num_iters=7, evaluate=evaluate, eval_every=3, logger=logger,
                    start={"episodes": 0})
    assert [r["iter"] for r in rows] == list(range(8))
    assert seen == list(range(7))
    assert rows[0] == {"iter": 0, "episodes": 0, "eval/n": 1, "time/eval_s": rows[0]["time/eval_s"]}
    # the batch of row k was sampled after k - 1 updates, and its update is the k-th
    assert all(r["rollout/it"] == r["iter"] - 1 == r["u"] for r in rows[1:])
    assert [r["iter"] for r in loop.eval_rows(rows)] == [0, 3, 6, 7]
    assert len(calls) == 4 and len(logger.rows) == 8


def test_initial_eval_is_reused_and_no_evaluate_means_no_start_row():
    calls, evaluate = _counting_model()
    rows = loop.run(None, lambda m, it: _Batch(it), lambda b, it: {}, num_iters=2,
                    evaluate=evaluate, initial_eval={"n": 0.5}, eval_every=5)
    assert rows[0]["eval/n"] == 0.5 and "time/eval_s" not in rows[0]
    assert len(calls) == 1 and rows[-1]["eval/n"] == 1  # only after the last update
    plain = loop.run(None, lambda m, it: _Batch(it), lambda b, it: {}, num_iters=2)
    assert [r["iter"] for r in plain] == [1, 2]


def test_stop_ends_early_and_evaluates_the_stopping_row():
    calls, evaluate = _counting_model()
    rows = loop.run(None, lambda m, it: _Batch(it), lambda b, it: {"paid": 3 * (it + 1)},
                    num_iters=100, evaluate=evaluate, eval_every=50,
                    stop=lambda row: row["paid"] >= 7)
    assert [r["iter"] for r in rows] == [0, 1, 2, 3] and "eval/n" in rows[-1]
    assert "eval/n" not in rows[1] and len(calls) == 2


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="eval_every"):
        loop.run(None, None, None, 3, eval_every=0)


def test_optimizer_step_returns_the_pre_clip_norm_and_clips():
    w = torch.nn.Parameter(torch.tensor([3.0, 4.0]))
    opt = torch.optim.SGD([w], lr=1.0)
    norm = optimizer_step(opt, (w * torch.tensor([3.0, 4.0])).sum(), max_grad_norm=1.0)
    assert norm == pytest.approx(5.0)  # grad (3, 4) before the clip
    assert torch.allclose(w.detach(), torch.tensor([3.0 - 0.6, 4.0 - 0.8]))  # the clipped step
    assert grad_norm([w]) == pytest.approx(1.0)  # the clipped gradient left behind


def test_agent_pg_rows_follow_the_frame():
    make_env = lambda: GridAgentEnv(max_turns=6)  # noqa: E731
    pol = KeyTablePolicy(4, seed=0)
    cfg = agent_pg.AgentPGConfig(num_iters=4, num_prompts=2, group_size=3, eval_every=2, seed=1)
    rows = agent_pg.train(make_env, pol, cfg, list(range(5)),
                          evaluate=lambda p: agent_pg.evaluate(make_env, p, [0, 1]))
    assert [r["iter"] for r in rows] == [0, 1, 2, 3, 4]
    assert [r["episodes"] for r in rows] == [0, 6, 12, 18, 24]
    assert [r["iter"] for r in loop.eval_rows(rows)] == [0, 2, 4]
    assert all("losses/grad_norm" in r and "rollout/success" in r for r in rows[1:])


def test_arpo_stops_at_its_tool_call_budget():
    from agentrl_lib.envs.calc_crux import ACTIONS, CalcCruxEnv

    pol = KeyTablePolicy(len(ACTIONS), seed=0)
    cfg = arpo.ARPOConfig(num_iters=50, num_prompts=2, max_tool_calls=12, eval_every=100, seed=0)
    rows = arpo.train(CalcCruxEnv, pol, cfg, list(range(10)), evaluate=lambda p: {"x": 1.0})
    paid = [r["charts/tool_calls"] for r in rows]
    assert paid[0] == 0 and paid[-2] < 12 <= paid[-1] and "eval/x" in rows[-1]
    assert np.all(np.diff(paid) > 0)
