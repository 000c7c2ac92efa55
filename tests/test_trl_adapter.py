"""The TRL adapter: the config mapping is complete and round-trips, unsupported settings raise,
TRL sees the same prompt tokens, TRL's loss on its own batch equals ours on the same batch, and a
short TRL run changes the parameters and evaluates at the right steps."""

import random
import tempfile
from dataclasses import fields, replace

import pytest
import torch

pytest.importorskip("trl")

from agentrl_lib.algorithms import grpo, trl_adapter  # noqa: E402
from agentrl_lib.algorithms.grpo import GRPOConfig  # noqa: E402


def length_reward(completions, **kwargs):
    """A reward that varies inside a group even for an untrained model: completion length / 6."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [len(t) / 6 for t in texts]


def test_every_field_is_accounted_for():
    names = {f.name for f in fields(GRPOConfig)}
    assert trl_adapter.trl_cfg_fields_covered() == names
    groups = [set(trl_adapter.MAPPED), set(trl_adapter.TRL_FIXED), set(trl_adapter.LOOP_ONLY)]
    assert sum(len(g) for g in groups) == len(set().union(*groups))  # no field in two groups
    for name, value in trl_adapter.TRL_FIXED.items():  # the fixed values are our defaults
        assert getattr(GRPOConfig(), name) == value


def random_supported_config(rng: random.Random) -> GRPOConfig:
    cispo = rng.random() < 0.3
    loss_agg = "token_mean" if cispo else rng.choice(["seq_mean", "token_mean", "const_norm"])
    return GRPOConfig(
        estimator=rng.choice(["grpo", "dr_grpo", "lite_ppo"]), loss_agg=loss_agg,
        is_level=rng.choice(["token", "sequence"]), clip="cispo" if cispo else "ppo",
        # cispo: TRL's epsilon_high is 1 + clip_eps_high; these values make that sum exact
        clip_eps=rng.choice([1.0, 1.5]) if cispo else rng.choice([0.1, 0.2, 0.3]),
        clip_eps_high=rng.choice([0.25, 4.0]) if cispo else rng.choice([None, 0.28]),
        beta=rng.choice([0.0, 0.04]), num_prompts=rng.randint(1, 8), group_size=rng.randint(2, 8),
        num_iters=rng.randint(1, 500), num_epochs=rng.randint(1, 4),
        lr=rng.choice([1e-4, 3e-4, 1e-3]), max_new_tokens=rng.randint(1, 32),
        temperature=rng.choice([0.7, 1.0, 1.3]), max_grad_norm=rng.choice([0.5, 1.0]),
        seed=rng.randint(0, 100), eval_every=rng.randint(1, 50),
        overlong_filter=(loss_agg == "token_mean" and rng.random() < 0.5))


def test_round_trip_and_values():
    rng = random.Random(0)
    out = tempfile.mkdtemp()
    for _ in range(25):
        cfg = random_supported_config(rng)
        args = trl_adapter.to_trl_config(cfg, out)
        assert trl_adapter.from_trl_config(args, eval_every=cfg.eval_every) == cfg
        # the settings that are not fields of ours, but that our loop fixes
        assert args.lr_scheduler_type == "constant" and args.weight_decay == 0.0
        assert args.generation_batch_size == cfg.num_prompts * cfg.group_size
        assert args.steps_per_generation == 1 and args.gradient_accumulation_steps == 1
        assert not args.bf16 and not args.use_vllm and args.top_k == 0 and args.top_p == 1.0
    args = trl_adapter.to_trl_config(grpo.preset("dr_grpo"), out)
    assert (args.loss_type, args.scale_rewards) == ("dr_grpo", "none")
    args = trl_adapter.to_trl_config(grpo.preset("lite_ppo_plain"), out)  # ROLL's: no TRL form
    assert (args.loss_type, args.scale_rewards) == ("bnpo", "batch")
    args = trl_adapter.to_trl_config(grpo.preset("gspo"), out)  # TRL's paper index's GSPO values
    assert (args.importance_sampling_level, args.loss_type, args.epsilon, args.epsilon_high) == \
        ("sequence", "grpo", 3e-4, 4e-4)
    args = trl_adapter.to_trl_config(grpo.preset("cispo"), out)
    assert (args.loss_type, args.epsilon_high, args.importance_sampling_level) == \
        ("cispo", 5.0, "token")
    # a sum 1 + clip_eps_high that is not exact comes back within rounding
    args = trl_adapter.to_trl_config(grpo.preset("cispo", clip_eps_high=0.28), out)
    back = trl_adapter.from_trl_config(args)
    assert back.clip == "cispo" and abs(back.clip_eps_high - 0.28) < 1e-15


@pytest.mark.parametrize("change,match", [
    (dict(estimator="rloo"), "not a GRPOTrainer option"),
    (dict(std_ddof=0), "std_ddof"),
    (dict(kl_estimator="k2"), "kl_estimator"),
    (dict(dynamic_sampling=True), "dynamic_sampling"),
    (dict(overlong_buffer=2), "overlong_buffer"),
    (dict(whiten_adv=True), "whiten_adv"),
    (dict(adv_clip=2.0), "adv_clip"),
    (dict(dual_clip=1.4), "dual_clip"),
    (dict(dynamic_sampling=True, max_num_gen_batches=10), "dynamic_sampling"),
    (dict(max_groups=40), "max_groups"),
    (dict(overlong_filter=True, loss_agg="seq_mean"), "token_mean"),
    (dict(estimator="reinforce_pp"), "not a GRPOTrainer option"),
    (dict(clip="cispo", clip_eps=1.0, clip_eps_high=4.0, loss_agg="seq_mean"), "token_mean"),
    (dict(clip="cispo", clip_eps=0.2, clip_eps_high=4.0, loss_agg="token_mean"), "clip_eps >= 1"),
    (dict(clip="cispo", clip_eps=1.0, loss_agg="token_mean"), "clip_eps_high set"),
])
def test_unsupported_settings_raise(change, match):
    with pytest.raises(ValueError, match=match):
        trl_adapter.to_trl_config(replace(GRPOConfig(), **change), tempfile.mkdtemp())
    with pytest.raises(ValueError):
        trl_adapter.to_trl_config(grpo.preset("dapo"), tempfile.mkdtemp())
    with pytest.raises(ValueError):
        trl_adapter.to_trl_config(grpo.preset("lite_ppo"), tempfile.mkdtemp())


def test_dataset_columns():
    probs = [{"prompt": "1+2=", "answer": "3", "task": "arithmetic", "difficulty": 1}]
    ds = trl_adapter.to_dataset(probs)
    assert ds[0]["prompt"] == [{"role": "user", "content": "1+2="}] and ds[0]["answer"] == "3"
    assert trl_adapter.to_dataset(probs, conversational=False)[0]["prompt"] == "1+2="


def _tiny_setup(num_iters=2, **cfg_kw):
    from agentrl_lib.envs.text_tasks import make_problems
    from agentrl_lib.models.loading import load_policy
    from agentrl_lib.models.tiny_lm import new_model

    model, tok = new_model("tiny-64", seed=0)
    folder = tempfile.mkdtemp()  # TRL rebuilds its reference model (beta != 0) from this folder
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    model, tok = load_policy(folder)
    probs = make_problems("arithmetic", 40, 2, "train", seed=0)
    cfg = GRPOConfig(num_prompts=2, group_size=4, num_iters=num_iters, max_new_tokens=5,
                     lr=1e-3, eval_every=1, **cfg_kw)
    return model, tok, probs, cfg


def test_trl_sees_our_prompt_tokens():
    from agentrl_lib.rollout import encode_prompts, format_prompts

    model, tok, probs, cfg = _tiny_setup()
    trainer = trl_adapter.make_trainer(model, tok, probs, [length_reward], cfg, tempfile.mkdtemp())
    convs = [[{"role": "user", "content": p["prompt"]}] for p in probs[:6]]
    trl_ids = trainer._tokenize_prompts(convs)[0]
    ids, mask = encode_prompts(tok, format_prompts(tok, probs[:6]), "cpu")
    ours = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    assert [list(x) for x in trl_ids] == ours


@pytest.mark.parametrize("loss_agg,estimator,beta,extra", [
    ("seq_mean", "grpo", 0.0, {}), ("token_mean", "lite_ppo", 0.0, {}),
    ("const_norm", "dr_grpo", 0.04, {}),
    ("seq_mean", "grpo", 0.0, dict(is_level="sequence", clip_eps=3e-4, clip_eps_high=4e-4)),  # GSPO
    ("token_mean", "grpo", 0.0, dict(clip="cispo", clip_eps=1.0, clip_eps_high=4.0)),  # CISPO
])
def test_trl_loss_on_its_batch_equals_ours(loss_agg, estimator, beta, extra):
    """Generate and score one batch with TRL, then compute TRL's loss and gradient and ours
    (sequence_logps + core.group_advantages + policy_loss) on exactly that batch. On-policy
    (rho = 1), so this checks the mapping of is_level and clip; tests/test_grpo.py checks the
    losses at ratios far from 1."""
    import copy

    from agentrl_lib.core import group_advantages
    from agentrl_lib.rollout import sequence_logps

    model, tok, probs, cfg = _tiny_setup(loss_agg=loss_agg, estimator=estimator, beta=beta, **extra)
    ref = copy.deepcopy(model).eval()
    if beta:
        # a model without a folder cannot be TRL's reference
        with pytest.raises(ValueError, match="reference"):
            bare = copy.deepcopy(model)
            bare.config._name_or_path = ""
            trl_adapter.make_trainer(bare, tok, probs, [length_reward], cfg, tempfile.mkdtemp())
    trainer = trl_adapter.make_trainer(model, tok, probs, [length_reward], cfg, tempfile.mkdtemp())
    batch = [dict(r) for r in trl_adapter.to_dataset(probs[:2]) for _ in range(cfg.group_size)]
    model.train()
    with torch.no_grad():
        inputs = trainer._generate_and_score_completions(batch)
    texts = tok.batch_decode(inputs["completion_ids"] * inputs["completion_mask"],
                             skip_special_tokens=True)
    rewards = torch.tensor(length_reward(texts)).view(2, cfg.group_size)
    adv = group_advantages(rewards, cfg.estimator, cfg.std_ddof).reshape(-1)
    assert torch.allclose(adv, inputs["advantages"], atol=1e-5)
    # An untrained model rarely stops early, and with equal lengths the aggregations coincide:
    # give the rows different lengths (the same mask goes to both losses).
    B, T = inputs["completion_ids"].shape
    lengths = torch.randint(1, T + 1, (B,), generator=torch.Generator().manual_seed(0))
    lengths[0], lengths[1] = 1, T
    inputs["completion_mask"] = (torch.arange(T)[None] < lengths[:, None]).long()
    inputs["num_items_in_batch"] = inputs["completion_mask"].sum()  # cispo's token count
    args = (inputs["prompt_ids"], inputs["prompt_mask"], inputs["completion_ids"],
            inputs["completion_mask"])

    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop; no accumulation
    loss_trl = trainer.compute_loss(model, inputs)
    g_trl = torch.autograd.grad(loss_trl, list(model.parameters()))
    logps, _ = sequence_logps(model, *args, temperature=cfg.temperature)
    ref_logps = None
    if beta:
        ref_logps = sequence_logps(ref, *args, temperature=cfg.temperature)[0].detach()
    loss_ours, _ = grpo.policy_loss(logps, logps.detach(), adv, inputs["completion_mask"], cfg,
                                    ref_logps, max_len=cfg.max_new_tokens)
    g_ours = torch.autograd.grad(loss_ours, list(model.parameters()))
    assert torch.allclose(loss_ours, loss_trl, atol=1e-5), (loss_ours.item(), loss_trl.item())
    num = sum(((a - b) ** 2).sum() for a, b in zip(g_ours, g_trl)).sqrt()
    den = sum((b ** 2).sum() for b in g_trl).sqrt()
    assert den > 0 and num / den < 1e-3, (num.item(), den.item())


def test_short_trl_run_changes_parameters_and_evaluates_on_schedule():
    model, tok, probs, cfg = _tiny_setup(num_iters=3)
    cfg = replace(cfg, eval_every=2)
    calls = []
    cb = trl_adapter.HeldOutEval(lambda m: calls.append(m.training) or {"acc": 0.5}, cfg.eval_every)
    before = [p.detach().clone() for p in model.parameters()]
    trainer = trl_adapter.make_trainer(model, tok, probs, [length_reward], cfg, tempfile.mkdtemp(),
                                       callbacks=[cb])
    trainer.train()
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert [r["iter"] for r in cb.rows] == [0, 2, 3]  # the steps grpo.train evaluates at
    assert [r["eval/acc"] for r in cb.rows] == [0.5] * 3
    assert trainer.state.global_step == 3
    assert all(r["time/train_s"] >= 0 for r in cb.rows)
    assert cb.rows[0]["time/train_s"] < cb.rows[-1]["time/train_s"]


def test_checkpointing_flag_follows_the_transformers_version(monkeypatch, tmp_path):
    """transformers 5.23 names it activation_checkpointing; 5.17 (the lent H200's, where the first
    make gpu-check failed on it) has gradient_checkpointing only: to_trl_config sets the one there."""
    import dataclasses

    from trl import GRPOConfig as TRLGRPOConfig

    from agentrl_lib.algorithms import trl_adapter

    cfg = trl_adapter.GRPOConfig(num_prompts=2, group_size=2)
    args = trl_adapter.to_trl_config(cfg, str(tmp_path))
    assert args.activation_checkpointing is False and args.gradient_checkpointing is False
    seen = {}

    def old_fields(_):  # the 5.17 field set: no activation_checkpointing
        return [f for f in dataclasses.fields(TRLGRPOConfig) if f.name != "activation_checkpointing"]

    def fake_config(**kwargs):
        seen.update(kwargs)
        return TRLGRPOConfig(**kwargs)

    monkeypatch.setattr(trl_adapter, "fields", old_fields)
    monkeypatch.setattr("trl.GRPOConfig", fake_config)
    trl_adapter.to_trl_config(cfg, str(tmp_path))
    assert seen["gradient_checkpointing"] is False and "activation_checkpointing" not in seen
