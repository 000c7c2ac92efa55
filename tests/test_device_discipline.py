"""Device discipline of every LM code path, checked without a GPU.

Each LM loop runs one update with torch's default device set to ``meta`` while the model stays on
the CPU. A tensor built without an explicit ``device=`` then lands on ``meta``, and the first
operation that mixes it with the model's tensors raises, or the meta result it contaminates raises
when the loop reads it (``.item()``, ``.tolist()``, a copy to the CPU). On a GPU the same bug
builds the tensor on the CPU next to a CUDA model (issue 11: notebook 10's probe ids, ``pad_episodes``,
``sft.masked_nll``), so this catches a regression in CI without one. Host-side bookkeeping must say
``device="cpu"``; everything the model touches takes the model's device.
"""

import numpy as np
import pytest
import torch

from agentrl_lib.algorithms import grpo, ppo_lm, sft
from agentrl_lib.algorithms.grpo import GRPOConfig
from agentrl_lib.envs.multiturn import GridAgentEnv
from agentrl_lib.envs.text_tasks import make_problems
from agentrl_lib.models.tiny_lm import new_model
from agentrl_lib.rewards.verifiable import correctness_reward as accuracy_reward
from agentrl_lib.rollout import chat_example, episode_logps, generate, play_episodes, \
    text_episodes_to_tokens

LAYOUT = ["...", ".#.", "..."]
_FORMS = {}  # the environments' tabular forms, built on the host before the checks start


def make_env():
    """A grid env whose tabular forms (host-side numerics, not an LM path) were built outside the
    meta context and are shared."""
    env = GridAgentEnv(layout=LAYOUT, max_turns=2)
    if not _FORMS:
        for task in env.tasks:
            env.tabular_form(*task)
        _FORMS.update(env._mdps)
    env._mdps = _FORMS
    return env


@pytest.fixture(scope="module", autouse=True)
def _host_forms():
    make_env()


def guard(module: torch.nn.Module, device: torch.device):
    """Pre-hooks on every submodule: each tensor it is called with must be on ``device``. (An
    embedding looked up with meta ids on CPU weights returns garbage instead of raising.)"""
    def check(mod, args, kwargs):
        for x in list(args) + list(kwargs.values()):
            if isinstance(x, torch.Tensor) and x.device != device:
                raise RuntimeError(f"{type(mod).__name__} called with a tensor on {x.device}, "
                                   f"the model is on {device}")
    for m in module.modules():
        m.register_forward_pre_hook(check, with_kwargs=True)
    return module


@pytest.fixture(scope="module")
def lm():
    torch.set_num_threads(1)
    model, tok = new_model("tiny-64", seed=0)
    return guard(model, torch.device("cpu")), tok


@pytest.fixture
def on_meta_default():
    """Everything inside runs with torch's default device set to 'meta' (the model was built before)."""
    with torch.device("meta"):
        yield


def test_the_check_catches_an_implicit_device(lm, on_meta_default):
    model, _ = lm
    ids = torch.tensor([[1, 2, 3]])  # no device=: lands on meta
    with pytest.raises(RuntimeError, match="on meta"):
        model(input_ids=ids)
    assert model(input_ids=torch.tensor([[1, 2, 3]], device="cpu")).logits.shape == (1, 3, len(lm[1]))


def test_generate_and_evaluate(lm, on_meta_default):
    model, tok = lm
    g = generate(model, tok, ["a", "bc"], max_new_tokens=3,
                 generator=torch.Generator(device="cpu").manual_seed(0))
    assert g.completion_ids.device.type == "cpu" and g.logps.device.type == "cpu"
    probs = make_problems("arithmetic", 2, 1, "test", seed=0)
    assert 0.0 <= grpo.evaluate(model, tok, probs, accuracy_reward, 4)["acc"] <= 1.0


@pytest.mark.parametrize("estimator", ["grpo", "rloo"])
def test_single_turn_grpo_update(lm, estimator, on_meta_default):
    model, tok = lm
    cfg = GRPOConfig(estimator=estimator, num_prompts=2, group_size=2, max_new_tokens=3,
                     num_iters=1, eval_every=1, lr=1e-3, beta=0.0)
    probs = make_problems("arithmetic", 4, 1, "train", seed=0)
    sample = grpo.completion_sampler(tok, probs, [accuracy_reward], cfg)
    rows = grpo.train(model, sample, cfg)
    assert np.isfinite(rows[0]["losses/loss"])


@pytest.mark.parametrize("estimator", ["grpo", "gigpo"])
def test_multi_turn_grpo_update(lm, estimator, on_meta_default):
    model, tok = lm
    cfg = GRPOConfig(estimator=estimator, num_prompts=2, group_size=2, max_new_tokens=3,
                     max_turns=2, num_iters=1, eval_every=1, lr=1e-3)
    sample = grpo.episode_sampler(tok, make_env, list(range(8)), cfg)
    rows = grpo.train(model, sample, cfg, evaluate=lambda m: grpo.evaluate_agent(
        m, tok, make_env, [0, 1], max_turns=2, max_new_tokens=3, samples=1))
    assert "eval/success" in rows[0]  # the start's evaluation; then the update, evaluated after
    assert np.isfinite(rows[1]["losses/loss"]) and "eval/success" in rows[1]


def test_multi_turn_credit_fn(lm, on_meta_default):
    model, tok = lm
    cfg = GRPOConfig(num_prompts=2, group_size=2, max_new_tokens=3, max_turns=2, num_iters=1,
                     eval_every=1, lr=1e-3)
    sample = grpo.episode_sampler(tok, make_env, list(range(8)), cfg)
    def ones(eps):  # a stateful estimator that reports on each call
        ones.metrics.append({"calls": len(ones.metrics) + 1, "note": "not a number"})
        return [np.ones(len(ep)) for ep in eps]
    ones.metrics = []
    row = grpo.train(model, sample, cfg, credit_fn=ones)[0]
    assert np.isfinite(row["losses/loss"]) and row["credit/calls"] == 1 and "credit/note" not in row


@pytest.mark.parametrize("critic", ["separate", "shared"])
def test_ppo_lm_update(lm, critic, on_meta_default):
    model, tok = lm
    cfg = ppo_lm.PPOLMConfig(critic=critic, num_prompts=2, group_size=2, max_new_tokens=3,
                             num_iters=1, eval_every=1)
    probs = make_problems("arithmetic", 4, 1, "train", seed=0)
    sample = grpo.completion_sampler(tok, probs, [accuracy_reward], cfg)
    rows = ppo_lm.train(model, sample, cfg)
    assert np.isfinite(rows[0]["losses/policy_loss"])


def test_sft_losses(lm, on_meta_default):
    model, tok = lm
    batch = [chat_example(tok, "1+1", "answer 2"), chat_example(tok, "2+2", "answer 4")]
    assert torch.isfinite(sft.masked_nll(model, batch, tok.pad_token_id))
    history = sft.fit(model, lambda _: batch, lambda b: sft.masked_nll(model, b, tok.pad_token_id),
                      steps=1, lr=1e-4)
    assert np.isfinite(history[-1][1])
    eps = play_episodes(make_env, sft.scripted_policy(0.3, np.random.default_rng(0)), [0, 1], 1, 2)
    text_episodes_to_tokens(tok, eps, GridAgentEnv.system_prompt)
    logps, _, mask = episode_logps(model, eps, pad_id=tok.pad_token_id)  # agent SFT's loss terms
    assert torch.isfinite((logps * mask).sum())


def test_preference_lm_paths(lm, on_meta_default):
    """Part 2's LM paths: DPO (sigmoid and INPO) through ``dpo.train`` on ``lm_pair_logps``, RDPO's
    rationale term and the LM's policy over a candidate set."""
    from agentrl_lib.algorithms import dpo, inpo

    model, tok = lm
    prompts, chosen, rejected = ["1+1", "2+2"], ["2", "4"], ["3", "the answer is 5"]
    pair_logps = dpo.lm_pair_logps(model, tok, prompts, chosen, rejected)
    ref_c, ref_r = dpo.reference_logps(pair_logps, 2)
    assert ref_c.device.type == "cpu"
    rows = dpo.train(model.parameters(), pair_logps, 2, dpo.DPOConfig(lr=1e-4, num_epochs=1),
                     ref_c, ref_r,
                     extra_loss=lambda idx: dpo.lm_rationale_nll(
                         model, tok, [prompts[i] for i in idx.tolist()],
                         [chosen[i] for i in idx.tolist()], [rejected[i] for i in idx.tolist()],
                         ["A is correct"] * len(idx), gamma=0.1)[0].mean())
    assert np.isfinite(rows[-1]["losses/dpo"])
    with torch.no_grad():
        c, r = pair_logps(torch.arange(2, device="cpu"))
        losses, _ = dpo.dpo_loss(c, r, ref_c, ref_r, beta=0.5, loss_type="inpo", eta=0.5,
                                 prev_chosen_logps=ref_c, prev_rejected_logps=ref_r)
    assert torch.isfinite(losses).all()
    logp = inpo.lm_candidate_logps(model, tok, prompts, [["2", "3"], ["4", "5"]])  # (S, K)
    assert torch.allclose(logp.exp().sum(-1), torch.ones(2, device="cpu"), atol=1e-5)


def test_reward_head_fit(lm):
    """The Bradley-Terry LM head (built on the host first: building a model is not the loop)."""
    from agentrl_lib.rewards import reward_model

    model, tok = lm
    rm = guard(reward_model.lm_reward_model(model, seed=0), torch.device("cpu"))
    texts_c = reward_model.chat_texts(tok, ["1+1", "2+2"], ["2", "4"])
    texts_r = reward_model.chat_texts(tok, ["1+1", "2+2"], ["3", "the answer is 5"])
    with torch.device("meta"):
        hist = reward_model.fit(rm.parameters(),
                                reward_model.lm_pair_rewards(rm, tok, texts_c, texts_r), 2,
                                lr=1e-4, num_epochs=1)
    assert np.isfinite(hist[-1]["losses/bt"])


@pytest.mark.parametrize("arm", ["spo", "reward_model"])
def test_spo_and_inpo_lm_loops(lm, arm, on_meta_default):
    """SPO (both arms) and INPO's rounds with the LM as the policy over a candidate set."""
    from agentrl_lib.algorithms import inpo, spo
    from agentrl_lib.envs.pref_bandit import PrefBandit

    model, tok = lm
    bandit = PrefBandit.rock_paper_scissors()
    prompts, cands = ["1+1", "2+2"], [["2", "3", "4"], ["4", "5", "6"]]
    out = spo.lm_train(model, tok, prompts, cands, bandit,
                       spo.SPOConfig(arm=arm, num_iters=1, num_samples=2, lr=1e-4, rm_num_pairs=4))
    assert np.isfinite(out["exploitability"][-1])
    if arm == "spo":
        out = inpo.lm_iterate(model, tok, prompts, cands, bandit,
                              inpo.IterConfig(num_iters=1, num_pairs=2, inner_steps=1, inner_lr=1e-4))
        assert np.isfinite(out["exploitability"][-1])
