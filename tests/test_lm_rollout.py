"""Multi-turn LM rollouts (``rollout.lm_rollout``): the token record (loss mask exactly on the
agent's tokens, turn spans), batched rollout with a persistent KV cache == the naive loop == an
independent text-level loop, recomputed log-probs == sampling log-probs, malformed output through
the env's error path, GRPO's one loop on episodes (``grpo.episode_sampler``), and the scripted
warm-start data (``sft``)."""

import numpy as np
import pytest
import torch

from agentrl_lib.algorithms import grpo, sft
from agentrl_lib.algorithms.grpo import GRPOConfig
from agentrl_lib.envs.multiturn import GridAgentEnv
from agentrl_lib.rollout import (
    episode_logps,
    generate,
    lm_rollout,
    naive_rollout,
    observation_text,
    pad_episodes,
    play_episodes,
    text_episodes_to_tokens,
)

SYSTEM_PROMPT = GridAgentEnv.system_prompt

LAYOUT = ["...", ".#.", "..."]


def make_env(max_turns=4):
    return lambda: GridAgentEnv(layout=LAYOUT, max_turns=max_turns)


@pytest.fixture(scope="module")
def moving_lm():
    """A tiny LM nudged to answer moves: a few SFT steps on the scripted policy, so episodes end at
    different turns (some reach the goal, some are cut) and actions are sometimes valid."""
    torch.set_num_threads(1)
    cfg = sft.AgentSFTConfig(env_kwargs=dict(layout=LAYOUT, max_turns=4), epsilon=0.5,
                             num_episodes=200, steps=40, max_turns=4, lr=1e-2)
    model, tok, _ = sft.train_agent_sft(cfg, verbose=False)
    return model, tok


def check_record(tok, ep, max_new_tokens):
    eos = tok.eos_token_id
    assert len(ep.turn_spans) == len(ep.actions) == len(ep.rewards) == len(ep.state_keys)
    assert len(ep.observations) == len(ep.actions)
    assert len(ep.token_ids) == len(ep.loss_mask) == len(ep.logps)
    # the mask is 1 exactly on the union of the turn spans
    in_span = np.zeros(len(ep.token_ids), dtype=int)
    for s, e in ep.turn_spans:
        assert 0 < e - s <= max_new_tokens
        in_span[s:e] = 1
    assert in_span.tolist() == ep.loss_mask
    # decoding the masked tokens of each turn gives the action text the env received
    for (s, e), a in zip(ep.turn_spans, ep.actions):
        assert tok.decode(ep.token_ids[s:e], skip_special_tokens=True) == a
        ids = ep.token_ids[s:e]
        assert eos not in ids[:-1]  # the span ends at its first end-of-turn token
        if ids[-1] != eos:  # cut at max_new_tokens: a template eos (mask 0) closes the turn
            assert len(ids) == max_new_tokens and ep.token_ids[e] == eos and ep.loss_mask[e] == 0
    # the tokens between spans are the template around the next observation, nothing else
    for t in range(1, len(ep.actions)):
        prev_end, start = ep.turn_spans[t - 1][1], ep.turn_spans[t][0]
        between = ep.token_ids[prev_end:start]
        if ep.token_ids[prev_end - 1] != eos:
            between = between[1:]
        seg = tok(observation_text(tok, ep.observations[t], SYSTEM_PROMPT),
                  add_special_tokens=False)["input_ids"]
        assert between == seg
    # the record ends with the last action (the final observation is never shown to the agent)
    last = ep.turn_spans[-1][1]
    assert len(ep.token_ids) in (last, last + 1)
    # logps are 0 off the mask and negative on it
    lp = np.array(ep.logps)
    assert np.all(lp[np.array(ep.loss_mask) == 0] == 0.0) and np.all(lp[in_span == 1] <= 0)
    # the whole conversation is the chat template applied to the messages, token for token
    msgs = [{"role": "system", "content": SYSTEM_PROMPT}]
    for o, (s, e) in zip(ep.observations, ep.turn_spans):
        msgs += [{"role": "user", "content": o},
                 {"role": "assistant", "content": tok.decode(ep.token_ids[s:e]).removesuffix(
                     tok.eos_token)}]
    text = tok.apply_chat_template(msgs, tokenize=False)
    assert tok.decode(ep.prompt_ids + ep.token_ids) == text.removesuffix("\n")


def test_record_masks_and_spans(tiny_lm, moving_lm):
    for model, tok in (tiny_lm, moving_lm):
        eps = lm_rollout(model, tok, make_env(), [0, 1, 2, 3], group_size=3, max_turns=4,
                         max_new_tokens=6, generator=torch.Generator().manual_seed(0))
        assert len(eps) == 12 and [ep.group_id for ep in eps] == [g for g in range(4) for _ in range(3)]
        for ep in eps:
            check_record(tok, ep, 6)
    # the SFT'd model's episodes end at different turns, some by success
    lengths = {len(ep) for ep in eps}
    assert len(lengths) > 1 and any(ep.success for ep in eps)


def test_malformed_output_goes_through_error_path(tiny_lm):
    model, tok = tiny_lm  # an untrained model writes gibberish
    env_holder = []

    def mk():
        env_holder.append(GridAgentEnv(layout=LAYOUT, max_turns=3))
        return env_holder[-1]
    eps = lm_rollout(model, tok, mk, [5], group_size=2, max_turns=3, max_new_tokens=5,
                     generator=torch.Generator().manual_seed(1))
    for ep, env in zip(eps, env_holder):
        assert not any(ep.valid) and env.num_invalid == len(ep) == 3
        assert all(o.startswith("Invalid action") for o in ep.observations[1:])
        assert len(set(ep.state_keys)) == 1  # the state never moved
        assert ep.truncated and ep.ret == 0.0
        check_record(tok, ep, 5)


def test_batched_equals_naive_and_text_loop_greedy(moving_lm):
    model, tok = moving_lm
    seeds = [0, 3, 7, 11, 12]

    def varied_caps():  # env caps 1..4 in creation order, so rows leave the batch at different turns
        count = [0]

        def mk():
            count[0] += 1
            return GridAgentEnv(layout=LAYOUT, max_turns=1 + count[0] % 4)
        return mk
    a = lm_rollout(model, tok, varied_caps(), seeds, 2, 4, 6, greedy=True)
    b = naive_rollout(model, tok, varied_caps(), seeds, 2, 4, 6, greedy=True)
    assert [e.actions for e in a] == [e.actions for e in b]
    assert [e.token_ids for e in a] == [e.token_ids for e in b]
    assert [e.group_id for e in a] == [e.group_id for e in b]
    np.testing.assert_allclose(np.concatenate([e.logps for e in a]),
                               np.concatenate([e.logps for e in b]), atol=1e-5)
    assert len({len(e) for e in a}) > 1  # rows leave the batch at different turns
    # an independent loop: the chat template on message dicts and rollout.generate on strings
    for j, ep in enumerate(a):
        seed = seeds[j // 2]
        env = GridAgentEnv(layout=LAYOUT, max_turns=1 + (j + 1) % 4)
        msgs = [{"role": "system", "content": SYSTEM_PROMPT},
                {"role": "user", "content": env.reset(seed=seed)}]
        actions = []
        for _ in range(4):
            prompt = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
            text = generate(model, tok, [prompt], 6, greedy=True).texts[0]
            actions.append(text)
            obs, _, done, _ = env.step(text)
            if done:
                break
            msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": obs}]
        assert actions == ep.actions


def test_recomputed_logps_equal_sampling_logps(moving_lm):
    model, tok = moving_lm
    eps = lm_rollout(model, tok, make_env(), [0, 1, 2], 4, 4, 6, temperature=1.0,
                     generator=torch.Generator().manual_seed(2))
    logps, ents, mask = episode_logps(model, eps)
    padded = pad_episodes(eps, tok.pad_token_id, "cpu")
    old = padded.logps
    assert torch.equal(mask, padded.loss_mask) and logps.requires_grad
    assert mask.sum() == sum(sum(ep.loss_mask) for ep in eps)
    torch.testing.assert_close(logps, old, atol=2e-5, rtol=0)
    # batched sampling log-probs also equal a forward pass of each episode alone
    for i, ep in enumerate(eps[:4]):
        single, _, _ = episode_logps(model, [ep])
        n = len(ep.token_ids)
        torch.testing.assert_close(single[0, :n], logps[i, :n], atol=2e-5, rtol=0)
    # temperature: sampling logps are those of the tempered distribution
    eps = lm_rollout(model, tok, make_env(), [0, 1], 2, 3, 6, temperature=0.7,
                     generator=torch.Generator().manual_seed(3))
    logps, _, _ = episode_logps(model, eps, temperature=0.7)
    torch.testing.assert_close(logps, pad_episodes(eps, 0, "cpu").logps, atol=2e-5, rtol=0)


def test_sampled_distribution_batched_vs_naive(moving_lm):
    """Sampling: the same first-turn action distribution either way (both sample exactly from the
    same model; checked by frequency of the first action over 200 episodes, 5 sigma)."""
    model, tok = moving_lm
    a = lm_rollout(model, tok, make_env(), [4], 200, 1, 6, generator=torch.Generator().manual_seed(4))
    b = naive_rollout(model, tok, make_env(), [4], 200, 1, 6, generator=torch.Generator().manual_seed(5))
    for act in ("up", "down", "left", "right"):
        pa = np.mean([e.actions[0] == act for e in a])
        pb = np.mean([e.actions[0] == act for e in b])
        se = np.sqrt(max(pa * (1 - pa) + pb * (1 - pb), 1e-3) / 200)
        assert abs(pa - pb) < 5 * se
    # and the probability the batched record gives the first action is the model's own
    ep = a[0]
    lp = sum(ep.logps[s] for s in range(*ep.turn_spans[0]))
    assert lp < 0


def test_text_episodes_to_tokens_matches_rollout_record(moving_lm):
    """Scripted episodes get the same token layout an LM rollout records for the same texts."""
    model, tok = moving_lm
    eps = lm_rollout(model, tok, make_env(), [0, 1, 2], 2, 4, 6, greedy=True)
    ended = [e for e in eps if all(tok.eos_token_id in e.token_ids[s:t] for s, t in e.turn_spans)]
    assert ended
    import copy
    redo = text_episodes_to_tokens(tok, copy.deepcopy(ended), SYSTEM_PROMPT)
    for e, r in zip(ended, redo):
        assert (r.prompt_ids, r.token_ids, r.loss_mask, r.turn_spans) == \
            (e.prompt_ids, e.token_ids, e.loss_mask, e.turn_spans)


def test_scripted_policy_is_optimal_at_epsilon_zero():
    env_fn = lambda: GridAgentEnv(layout=LAYOUT, max_turns=8)  # noqa: E731
    eps = play_episodes(env_fn, sft.scripted_policy(0.0, np.random.default_rng(0)),
                        list(range(40)), 1, 8)
    for ep in eps:
        start, goal = ep.task
        # shortest path length on the ring around the centre wall
        d = abs(start[0] - goal[0]) + abs(start[1] - goal[1])
        if start[0] == goal[0] == 1 or start[1] == goal[1] == 1:
            d = max(d, 4) if d == 2 else d
        assert ep.success and len(ep) == d


class LengthRewardEnv(GridAgentEnv):
    """Reward = action length / 10 each turn: varies inside every group, so every update moves."""

    def step(self, action_text):
        obs, r, done, info = super().step(action_text)
        return obs, r + len(action_text) / 10, done, info


def test_training_step_changes_params_and_advantages(moving_lm):
    import copy
    model, tok = moving_lm
    model = copy.deepcopy(model)
    before = [p.detach().clone() for p in model.parameters()]
    mk = lambda: LengthRewardEnv(layout=LAYOUT, max_turns=3)  # noqa: E731
    for est in ("grpo", "gigpo", "salt", "hgpo"):
        cfg = GRPOConfig(estimator=est, num_iters=1, num_prompts=2, group_size=4, max_turns=3,
                         max_new_tokens=6, eval_every=1, lr=1e-3, loss_agg="token_mean")
        rows = grpo.train(model, grpo.episode_sampler(tok, mk, list(range(10)), cfg), cfg,
                          evaluate=lambda m: grpo.evaluate_agent(m, tok, mk, [0, 1], 3, 6, 1))
        assert [r["iter"] for r in rows] == [0, 1]
        assert "eval/success" in rows[0] and "losses/loss" in rows[1] and "rollout/turns" in rows[1]
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    with pytest.raises(ValueError, match="estimator"):
        GRPOConfig(estimator="ppo")
    with pytest.raises(ValueError, match="multi-turn"):
        grpo.turn_advantages([], GRPOConfig(estimator="rloo"))


def test_loss_zero_advantage_is_zero_and_gradient_only_from_masked_tokens(moving_lm):
    model, tok = moving_lm
    eps = lm_rollout(model, tok, make_env(), [0, 1], 2, 3, 6, generator=torch.Generator().manual_seed(6))
    g = pad_episodes(eps, tok.pad_token_id, "cpu")
    cfg = GRPOConfig(loss_agg="token_mean")
    logps, _, m = episode_logps(model, eps)
    loss, _ = grpo.policy_loss(logps, g.logps, torch.zeros_like(logps), g.loss_mask, cfg)
    assert loss.item() == 0.0
    # with ratio 1 the token-mean loss is -mean of the advantages on agent tokens
    adv = torch.randn_like(logps)
    loss, _ = grpo.policy_loss(logps, g.logps, adv, g.loss_mask, cfg)
    torch.testing.assert_close(loss, -(adv * m).sum() / m.sum(), atol=1e-4, rtol=0)
    # and its gradient flows only through the agent's tokens
    grad = torch.autograd.grad(loss, logps)[0]
    assert torch.all(grad[m == 0] == 0) and torch.all(grad[m == 1] != 0)


def test_cached_agent_model_is_the_notebooks_ci_start():
    """`agentrl cache grid-agent-bpe` (shipped; `make test` copies it) must be exactly the SFT start
    that notebook 30's ci defaults ask for, or the first notebook run pays minutes to train it."""
    from agentrl_lib import cli
    from agentrl_lib.algorithms.sft import BASE_MODELS, AgentSFTConfig
    from agentrl_lib.pipeline.notebooks import load_notebook, repo_root

    root = repo_root()
    p = {k: v.default for k, v in load_notebook(root / "notebooks" / "30_multiturn_agent.ipynb",
                                                root).params.items()}
    cfg = BASE_MODELS["grid-agent-bpe"]
    assert cfg.env_kwargs == dict(layout=p["layout"].split("|"), max_turns=p["max_turns"])
    assert (cfg.steps, cfg.epsilon, cfg.max_turns) == (p["sft_steps"], p["sft_epsilon"],
                                                       p["max_turns"])
    # the notebook builds its AgentSFTConfig from these four values and the defaults (lr, size...)
    assert cfg == AgentSFTConfig(env_kwargs=cfg.env_kwargs, epsilon=p["sft_epsilon"],
                                 steps=p["sft_steps"], max_turns=p["max_turns"])
    assert cli.main(["cache", "no-such-model"]) == 2


def test_credit_fn_replaces_the_turn_estimator(moving_lm):
    """``grpo.advantages(..., credit_fn=)``: turn t of every episode gets exactly what the plug
    returned for it, on each of its action tokens, and 0 on the environment's tokens."""
    model, tok = moving_lm
    cfg = GRPOConfig(num_prompts=2, group_size=3, max_turns=4, max_new_tokens=6)
    batch = grpo.episode_sampler(tok, make_env(), list(range(10)), cfg)(model)
    seen = []

    def plug(episodes):
        seen.append(len(episodes))
        return [np.arange(1.0, len(ep) + 1) for ep in episodes]  # turn t -> t + 1

    out = grpo.advantages(batch, cfg, credit_fn=plug)
    assert seen == [6] and out.advantages.shape == batch.seqs.completion_ids.shape
    for row, ep in zip(out.advantages, batch.episodes):
        want = torch.zeros(row.shape[0])
        for t, (s, e) in enumerate(ep.turn_spans):
            want[s:e] = t + 1
        assert torch.equal(row, want)
    with pytest.raises(ValueError, match="multi-turn"):
        single = grpo.Batch(batch.seqs, batch.rewards)  # no episodes: a single-turn batch
        grpo.advantages(single, cfg, credit_fn=plug)


def test_make_agent_env_names_the_choices():
    from agentrl_lib.envs import AGENT_ENVS, make_agent_env

    assert isinstance(make_agent_env("grid", layout=LAYOUT), GridAgentEnv)
    with pytest.raises(ValueError, match="unknown agent environment 'maze'.*grid"):
        make_agent_env("maze")
    assert set(AGENT_ENVS) >= {"grid", "twenty_questions", "shop"}


def test_notebook_31_lm_start_is_a_cached_named_base():
    """Notebook 31's LM part starts from ``sft.BASE_MODELS[lm_base]`` in every profile, and
    ``make test`` builds the CPU ones before the notebooks run (else ci pays minutes to train it)."""
    from agentrl_lib.algorithms.sft import BASE_MODELS, AgentSFTConfig
    from agentrl_lib.cli import shipped_bases
    from agentrl_lib.envs.multiturn import GridAgentEnv
    from agentrl_lib.pipeline.notebooks import load_notebook, repo_root

    root = repo_root()
    info = load_notebook(root / "notebooks" / "31_gigpo.ipynb", root)
    names = {info.params["lm_base"].default} | {
        over["lm_base"] for over in info.profiles.values() if "lm_base" in over}
    make_cache = shipped_bases()  # `make test` runs `agentrl cache --shipped`
    for name in names:
        cfg = BASE_MODELS[name]
        assert isinstance(cfg, AgentSFTConfig) and cfg.env == "grid"
        assert name in make_cache or cfg.device != "cpu"  # GPU bases are built on the GPU
        env = GridAgentEnv(**cfg.env_kwargs)
        assert (env.rows, env.cols) > (3, 3) and cfg.max_turns == env.max_turns


def test_agent_sft_init_fine_tunes_a_named_base(tmp_path, monkeypatch):
    """``AgentSFTConfig.init``: the named base's checkpoint is the start (lr = 0 leaves it
    unchanged), its cache key is part of the child's identity, and a wrong start is refused."""
    from agentrl_lib.algorithms import sft
    from agentrl_lib.algorithms.sft import AgentSFTConfig

    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    kw = dict(env_kwargs=dict(layout=["...", "..."], max_turns=2), num_episodes=4, max_turns=2,
              batch_size=2)
    parent = AgentSFTConfig(steps=1, **kw)
    monkeypatch.setitem(sft.BASE_MODELS, "test-parent", parent)
    child = AgentSFTConfig(steps=1, lr=0.0, init="test-parent", seed=3, **kw)
    model, _, _ = sft.train_agent_sft(child, verbose=False)
    start, _ = sft.load_base(parent)
    for (name, a), b in zip(model.state_dict().items(), start.state_dict().values()):
        assert torch.equal(a, b), name
    # the identity carries the start's key: another start is another cache entry
    assert sft._identity(child)["init"] == f"test-parent@{sft.config_key(parent)}"
    assert "init" not in sft._identity(parent)  # an unset init leaves old cache keys alone
    key = sft.config_key(child)
    monkeypatch.setitem(sft.BASE_MODELS, "test-parent", AgentSFTConfig(steps=2, **kw))
    assert sft.config_key(child) != key  # a changed start changes the child's key
    with pytest.raises(ValueError, match="size 'small-128'"):
        sft.train_agent_sft(AgentSFTConfig(size="small-128", init="test-parent", **kw), verbose=False)


def test_horizon_schedule_entropy_bonus_and_regulariser(moving_lm):
    """GRPOConfig.horizon_schedule cuts the sampling rounds' episodes at the scheduled caps;
    with zero advantages only the entropy terms move the model: the bonus's and the regulariser's
    gradients are those of their own losses, and the regulariser sees the update's index."""
    import copy
    model, tok = moving_lm
    cfg = GRPOConfig(num_prompts=2, group_size=2, max_new_tokens=6, horizon_schedule=((0, 1), (2, 3)))
    assert [grpo.max_turns_at(cfg, i) for i in range(4)] == [1, 1, 3, 3]
    sample = grpo.episode_sampler(tok, make_env(), list(range(10)), cfg)
    batches = [sample(model, it) for it in range(3)]  # it: updates done, as loop.run passes
    assert [b.metrics["rollout/max_turns"] for b in batches] == [1, 1, 3]
    assert all(len(ep) == 1 for b in batches[:2] for ep in b.episodes)
    with pytest.raises(ValueError, match="horizon_schedule"):
        GRPOConfig(horizon_schedule=((1, 2),))
    batch = batches[2]
    batch = grpo.advantages(batch, cfg, credit_fn=lambda eps: [np.zeros(len(e)) for e in eps])
    m0 = copy.deepcopy(model)
    out = grpo.update(m0, torch.optim.SGD(m0.parameters(), lr=0.0), batch, cfg)
    assert out["losses/grad_norm"] == 0.0  # zero advantages, no entropy term: no gradient
    seen = []

    def reg(ents, mask, it):
        seen.append((tuple(ents.shape), it))
        return -(ents * mask).sum() / mask.sum(), {"on": 1.0}
    for kw in (dict(cfg=replace_cfg(cfg, entropy_coef=1.0)), dict(cfg=cfg, regulariser=reg, it=5)):
        m1 = copy.deepcopy(model)
        out = grpo.update(m1, torch.optim.SGD(m1.parameters(), lr=0.0), batch, **kw)
        assert out["losses/grad_norm"] > 0
        assert out["losses/loss"] == pytest.approx(-out["losses/entropy"], rel=1e-5)
    assert seen == [(tuple(batch.seqs.loss_mask.shape), 5)] and out["losses/reg_on"] == 1.0


def replace_cfg(cfg, **kw):
    from dataclasses import replace
    return replace(cfg, **kw)


def test_turn_estimators_by_name_are_the_modules(moving_lm):
    """GRPOConfig(estimator='salt' | 'hgpo') on LM episodes is exactly the module's function."""
    from agentrl_lib.algorithms import hgpo, salt

    model, tok = moving_lm
    cfg = GRPOConfig(num_prompts=2, group_size=4, max_turns=4, max_new_tokens=6, gamma=0.9, omega=0.5)
    eps = grpo.episode_sampler(tok, make_env(), list(range(10)), cfg)(model).episodes
    for name, want in [("salt", salt.salt_advantages(eps, gamma=0.9)),
                       ("hgpo", hgpo.hgpo_advantages(eps, gamma=0.9, omega=0.5))]:
        got = grpo.turn_advantages(eps, replace_cfg(cfg, estimator=name))
        assert all(np.array_equal(a, b) for a, b in zip(got, want)), name
    with pytest.raises(ValueError, match="group_size"):
        GRPOConfig(estimator="salt", group_size=1)


def test_max_context_ends_an_episode_before_it_overflows(moving_lm):
    model, tok = moving_lm
    kw = dict(seeds=[0, 1, 2], group_size=2, max_turns=4, max_new_tokens=6,
              generator=torch.Generator().manual_seed(0))
    free = lm_rollout(model, tok, make_env(), **kw)
    kw["generator"] = torch.Generator().manual_seed(0)
    cap = 100  # BPE: the first prompt (system + o_0) is 34 tokens, each turn ~30
    capped = lm_rollout(model, tok, make_env(), max_context=cap, **kw)
    assert any(len(ep.prompt_ids) + len(ep.token_ids) > cap for ep in free)  # the cap binds
    for f, c in zip(free, capped):
        assert len(c.prompt_ids) + len(c.token_ids) <= cap
        # the same draws up to the cut: the capped record is a prefix of the free one
        assert c.actions == f.actions[:len(c.actions)] and c.token_ids == f.token_ids[:len(c.token_ids)]
        cut = len(c.actions) < len(f.actions)
        assert c.context_full == cut and (c.truncated or not cut)
        check_record(tok, c, 6)
    assert not any(ep.context_full for ep in free)


def test_fork_and_continue_greedy_reproduces_the_parent(moving_lm):
    from agentrl_lib.rollout import fork_episode, lm_continue
    model, tok = moving_lm
    parents = lm_rollout(model, tok, make_env(), [0, 1, 2, 3], 1, 4, 6, greedy=True)
    forks = [(p, t) for p in parents for t in range(len(p))]
    envs, kids = zip(*[fork_episode(make_env(), p, t, seed=p.group_id) for p, t in forks])
    for (p, t), kid in zip(forks, kids):  # the cut copies exactly the first t turns
        assert kid.actions == p.actions[:t] and kid.token_ids == p.token_ids[:p.turn_spans[t][0]]
    lm_continue(model, tok, list(envs), list(kids), max_turns=4, max_new_tokens=6, greedy=True)
    for (p, t), kid in zip(forks, kids):  # greedy from the same state: the same continuation
        assert kid.actions[:len(p)] == p.actions and kid.rewards[:len(p)] == p.rewards
        assert kid.token_ids[:len(p.token_ids)] == p.token_ids
    with pytest.raises(ValueError, match="fork turn"):
        fork_episode(make_env(), parents[0], len(parents[0]), seed=0)


def test_eval_panel_shows_progress_over_turns_unless_quiet(moving_lm, monkeypatch, capsys):
    model, tok = moving_lm
    for k in ("AGENTRL_QUIET", "CI", "AGENTRL_HEADLESS"):
        monkeypatch.delenv(k, raising=False)
    loud = grpo.evaluate_agent(model, tok, make_env(), [0, 1], max_turns=4, max_new_tokens=4,
                               samples=1, seed=3)
    assert "eval panel" in capsys.readouterr().err
    monkeypatch.setenv("AGENTRL_QUIET", "1")
    assert grpo.evaluate_agent(model, tok, make_env(), [0, 1], max_turns=4, max_new_tokens=4,
                               samples=1, seed=3) == loud  # the bar changes nothing it measures
    assert capsys.readouterr().err == ""


def test_sample_turns_is_the_rollouts_first_turn(tiny_lm):
    # the same contexts (the first prompts) and the same generator draw the same first actions
    model, tok = tiny_lm
    from agentrl_lib.rollout import sample_turns

    eps = lm_rollout(model, tok, make_env(), [0, 1, 2], group_size=2, max_turns=1,
                     max_new_tokens=5, generator=torch.Generator().manual_seed(3))
    rows, texts = sample_turns(model, tok, [ep.prompt_ids for ep in eps], 5,
                               generator=torch.Generator().manual_seed(3))
    assert rows == [ep.token_ids[s:e] for ep in eps for s, e in ep.turn_spans]
    assert texts == [ep.actions[0] for ep in eps]
