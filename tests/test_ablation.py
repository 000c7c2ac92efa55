"""The ablation grid helper: arm definitions, paired effects, and one tiny grid end to end."""

import math

import pytest
import torch

from agentrl_lib.algorithms.grpo import GRPOConfig, preset
from agentrl_lib.analysis import ablation
from agentrl_lib.analysis.ablation import CONTROL, ArmRun, mean_se, trick_arms, trick_effects


def test_arms_switch_one_field_from_grpo():
    arms = trick_arms(lr=3e-4, num_iters=7)
    base = arms["GRPO"]
    assert base == preset("grpo", lr=3e-4, num_iters=7)
    one_field = {"GRPO + batch std": ("estimator", "lite_ppo"), "GRPO - std": ("estimator", "dr_grpo"),
                 "GRPO + token-mean": ("loss_agg", "token_mean"),
                 "GRPO + clip-higher": ("clip_eps_high", 0.28),
                 "GRPO + overlong filter": ("overlong_filter", True)}
    fields = base.__dataclass_fields__
    for name, (f, v) in one_field.items():
        diff = [k for k in fields if getattr(arms[name], k) != getattr(base, k)]
        assert diff == [f] and getattr(arms[name], f) == v, (name, diff)
    assert arms["Lite-PPO"] == preset("lite_ppo", lr=3e-4, num_iters=7)
    assert arms["DAPO"] == preset("dapo", lr=3e-4, num_iters=7)
    assert arms["REINFORCE"].estimator == "batch_mean"
    for name, preset_name in (("REINFORCE++", "reinforce_pp"), ("GSPO", "gspo"), ("CISPO", "cispo")):
        assert arms[name] == preset(preset_name, lr=3e-4, num_iters=7)
    control = arms[CONTROL]
    assert control.lr == 0.0 and [k for k in fields if getattr(control, k) != getattr(base, k)] == ["lr"]
    assert all(a.lr == 3e-4 and a.num_iters == 7 for n, a in arms.items() if n != CONTROL)
    assert trick_arms(clip_eps_high=0.3)["DAPO"].clip_eps_high == 0.3


def _run(arm, d, seed, accs):
    return ArmRun(arm, d, seed, GRPOConfig(), [], list(range(len(accs))), accs, 0.0)


def test_gain_and_paired_effects_by_hand():
    runs = [_run("GRPO", 2, 0, [0.5, 0.6]), _run("X", 2, 0, [0.5, 0.55]),
            _run("GRPO", 2, 1, [0.5, 0.4]), _run("X", 2, 1, [0.5, 0.5]),
            _run("GRPO", 3, 0, [0.2, 0.2]), _run("X", 3, 0, [0.2, 0.3]), _run("Y", 4, 0, [0.1, 0.2])]
    assert math.isclose(runs[1].gain, 0.05) and runs[1].start_acc == 0.5 and runs[1].final_acc == 0.55
    eff = trick_effects(runs)
    assert set(eff) == {("X", 2), ("X", 3)}  # Y has no GRPO run at d=4 to pair with
    assert [round(e, 6) for e in eff[("X", 2)]] == [-0.05, 0.1]
    assert [round(e, 6) for e in eff[("X", 3)]] == [0.1]
    g = ablation.gains(runs)
    assert [round(x, 6) for x in g[("GRPO", 2)]] == [0.1, -0.1]
    m, se = mean_se([0.1, -0.1])
    assert abs(m) < 1e-12 and math.isclose(se, 0.1)


def test_tiny_grid_end_to_end_and_shared_random_numbers():
    """Two arms that compute the same thing give identical curves; a different arm does not
    change the start accuracy; eval points land where asked; the task reward excludes shaping;
    DAPO's refill stays within the rollout budget (max_groups) and is evaluated where it stops;
    Lite-PPO's KL term reads the start model."""
    from agentrl_lib.envs.text_tasks import make_problems
    from agentrl_lib.models.tiny_lm import new_model
    from agentrl_lib.rewards import format_reward

    torch.manual_seed(0)
    model, tok = new_model("tiny-64", seed=0)
    train_p = make_problems("arithmetic", 40, 1, strict=False)
    eval_p = make_problems("arithmetic", 8, 1, "test", strict=False)
    shared = dict(num_iters=3, num_prompts=2, group_size=4, max_new_tokens=4, lr=1e-3,
                  max_groups=6)  # num_iters x num_prompts groups: the same rollouts for every arm
    arms = trick_arms(**shared)
    grid = {"GRPO": arms["GRPO"],
            "GRPO + overlong filter": arms["GRPO + overlong filter"],  # budget 4: often truncated
            "GRPO again": arms["GRPO"], "DAPO (no refill)": arms["DAPO (no refill)"],
            "DAPO": arms["DAPO"], "Lite-PPO": arms["Lite-PPO"]}
    before = [p.detach().clone() for p in model.parameters()]
    runs = ablation.run_grid(model, tok, grid, [1], {1: (train_p, eval_p)}, [format_reward],
                             format_reward, eval_every=2, train_seeds=[5], progress=None)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))  # start model untouched
    by = {r.arm: r for r in runs}
    assert by["GRPO"].eval_steps == [0, 2, 3] and len(by["GRPO"].task_reward) == 3
    assert len({r.start_acc for r in runs}) == 1 and all(r.cfg.seed == 5 for r in runs)
    assert by["GRPO"].eval_acc == by["GRPO again"].eval_acc
    assert by["GRPO"].task_reward == by["GRPO again"].task_reward
    assert by["GRPO"].curve("rollout/reward") == by["GRPO"].task_reward  # no shaping in GRPO
    # DAPO's logged reward carries the soft overlong penalty, its task reward does not
    dapo = by["DAPO (no refill)"]
    assert all(r <= t + 1e-9 for r, t in zip(dapo.curve("rollout/reward"), dapo.task_reward))
    assert dapo.curve("rollout/gen_batches") == [1, 1, 1] and dapo.eval_steps == [0, 2, 3]
    # refill: several rounds an update, never past the 6 groups (3 rounds); evaluated at its end
    rounds = by["DAPO"].curve("rollout/gen_batches")
    assert sum(rounds) == 3 and by["DAPO"].rows[-1]["samples"] == 6 * 4
    assert by["DAPO"].eval_steps[-1] == len(rounds) == len(by["DAPO"].task_reward)
    assert all(r["samples"] == 4 * 2 * r["iter"] for r in by["GRPO"].rows)  # one round an update
    assert all("losses/kl" in r for r in by["Lite-PPO"].rows if "losses/loss" in r)
    assert trick_effects(runs)[("GRPO again", 1)] == [0.0]


@pytest.mark.parametrize("values,expected", [([2.0], (2.0, math.nan)), ([1.0, 3.0], (2.0, 1.0))])
def test_mean_se(values, expected):
    m, se = mean_se(values)
    assert m == expected[0] and (math.isnan(se) if math.isnan(expected[1]) else math.isclose(se, expected[1]))
