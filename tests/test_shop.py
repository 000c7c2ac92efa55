"""ShopEnv: protocol, malformed actions, true progress and the exact tabular form."""

import numpy as np

from agentrl_lib.algorithms import dp
from agentrl_lib.envs.shop import ShopEnv, eval_panel, make_catalog
from agentrl_lib.models.policies import tabular_agent
from agentrl_lib.rollout import play_episodes


def tiny_env(**kw):
    # one category, two items, two colours (both offered), one size
    cat = make_catalog(num_categories=1, items_per_category=2, num_colors=2, colors_per_item=2,
                       num_sizes=1, seed=0)
    return ShopEnv(cat, **kw)


def optimal_script(env, task):
    it = env.items[task[0]]
    return [f"search[{it['category']}]", f"click[{task[0]}]", f"choose[color={task[1]}]",
            f"choose[size={task[2]}]", "buy"]


def test_tiny_catalog_exact_values_by_hand():
    env = tiny_env(gamma=0.9)
    task = env.tasks[0]
    mdp, keys = env.tabular_form(task)
    # search page + one results page + 2 items x (colour none/2 values) x (size none/1) + sink
    assert mdp.num_states == 1 + 1 + 2 * 3 * 2 + 1 == 15
    v, pi, _, _ = dp.value_iteration(mdp)
    # shortest exact purchase: search, click, colour, size, buy -> reward 1 on the 5th step
    assert abs(v[0].item() - 0.9 ** 4) < 1e-12
    q = dp.q_from_v(mdp, v)
    page = keys.index((task, "item", keys[1][2], task[0], None, None))
    buy = env.actions.index("buy")
    assert abs(q[page, buy].item() - 0.5) < 1e-12  # buying now: category + material right
    back = env.actions.index("back")
    # back costs two steps to return to the same page: gamma^2 V*(page)
    assert abs(q[page, back].item() - 0.9 ** 2 * v[page].item()) < 1e-12
    # an invalid action (a second search here) is a self-loop: Q = gamma V*(page)
    search = env.actions.index(f"search[{env.categories[0]}]")
    assert abs(q[page, search].item() - 0.9 * v[page].item()) < 1e-12
    # wrong item with both options right scores 3/4 (category, colour, size)
    other = [n for n in env.items if n != task[0]][0]
    assert env.score(task, other, task[1], task[2]) == 0.75


def test_optimal_play_matches_v_star_and_progress_telescopes():
    env = ShopEnv(gamma=0.95)
    for seed in range(8):
        env.reset(seed=seed)
        task = env.task
        mdp, keys = env.tabular_form(task)
        v, pi, _, _ = dp.value_iteration(mdp)
        ret, disc, done, prog = 0.0, 1.0, False, [env.progress(env.state_key())]
        while not done:
            a = int(pi[env.state_index()].argmax())
            obs, r, done, info = env.step(env.actions[a])
            assert info["valid"]
            ret += disc * r
            disc *= env.gamma
            prog.append(info["progress"])
        assert info["success"] and abs(ret - v[0].item()) < 1e-12
        assert abs(v[0].item() - 0.95 ** 4) < 1e-12
        # true progress rises 0.2 per subgoal and its increments sum to the outcome
        assert np.allclose(np.diff(prog), 0.2) and abs(sum(np.diff(prog)) - 1.0) < 1e-12


def test_scripted_text_actions_and_free_text():
    env = ShopEnv()
    env.reset(seed=3)
    task = env.task
    it = env.items[task[0]]
    obs, r, done, info = env.step(f"I will search[{it['material']} {it['category']}] now")
    assert info["valid"] and task[0] in info["state_key"][2]
    for a in optimal_script(env, task)[1:]:
        obs, r, done, info = env.step(a)
    assert done and r == 1.0 and info["success"] and info["score"] == 1.0


def test_malformed_actions_never_crash():
    env = ShopEnv(invalid_penalty=-0.1, max_turns=12)
    env.reset(seed=0)
    start = env.state_key()
    bad = ["", "hello", "purchase[thing]", "search[]", "click[ghost-item]", "choose[color=red]",
           "buy", "back", "{'tool': 'search'}", "1234"]
    for text in bad:
        obs, r, done, info = env.step(text)
        assert not info["valid"] and obs.startswith("Invalid action") and r == -0.1
        assert env.state_key() == start and info["error"] and info["progress"] == 0.0
    assert env.num_invalid == len(bad)
    assert "unknown tool 'purchase'" in env.step("purchase[x]")[3]["error"]
    # on an item page: an option the item lacks, malformed choose, attribute unknown
    env.reset(seed=0)
    task = env.task
    for a in optimal_script(env, task)[:2]:
        env.step(a)
    page = env.state_key()
    missing = [c for c in env.colors if c not in env.items[task[0]]["color"]][0]
    for text in [f"choose[color={missing}]", "choose[color]", "choose[weight=5]", "search[mug]"]:
        _, _, _, info = env.step(text)
        assert not info["valid"] and env.state_key() == page
    env.reset(seed=0)
    for _ in range(12):
        _, _, done, info = env.step("???")
    assert done and info["truncated"]


def test_random_rollouts_agree_with_tabular_form():
    """Every sampled transition of the text env is the tabular form's (deterministic) one."""
    env = ShopEnv()
    uniform = np.full((1, len(env.actions)), 1.0 / len(env.actions))
    eps = play_episodes(lambda: ShopEnv(), tabular_agent(uniform, lambda e: 0,
                                                         np.random.default_rng(0)),
                        seeds=list(range(30)), group_size=2)
    n = 0
    for ep in eps:
        mdp, keys = env.tabular_form(ep.task)
        nxt = ep.state_keys[1:] + [ep.next_state_key]
        for t, (s, a, s2, r) in enumerate(zip(ep.state_keys, ep.action_ids, nxt, ep.rewards)):
            i = env.state_index(state_key=s)
            j = env.state_index(state_key=s2)
            assert mdp.P[i, a, j].item() == 1.0 and abs(mdp.R[i, a].item() - r) < 1e-12
            if not ep.valid[t]:
                assert i == j  # an invalid action leaves the state unchanged
            n += 1
    assert n > 100


def test_relative_key_and_panel_hash():
    env = ShopEnv()
    env.reset(seed=1)
    task = env.task
    assert env.relative_key(env.state_key()) == ("search", False, False, "none", "none")
    for a in optimal_script(env, task)[:3]:
        env.step(a)
    assert env.relative_key(env.state_key()) == ("item", True, True, "right", "none")
    assert env.relative_action(env.state_key(), "choose[size=" + task[2] + "]") == \
        "choose[size=target]"
    p1, h1 = eval_panel(env, 32)
    p2, h2 = eval_panel(ShopEnv(), 32)
    assert p1 == p2 and h1 == h2 and len(h1) == 16
    assert eval_panel(ShopEnv(make_catalog(seed=1)), 32)[1] != h1


def test_expert_actions_follow_q_star_and_finish_in_five():
    env = tiny_env(gamma=0.9)
    for task in env.tasks:
        env.reset(task=task)
        cat = env.items[task[0]]["category"]
        assert env.expert_actions() == [f"search[{cat}]"]
        env.step(f"search[{cat}]")
        assert env.expert_actions() == [f"click[{task[0]}]"]
        env.step(f"click[{task[0]}]")
        # colour and size commute: both are optimal on the target's page (ties listed)
        assert env.expert_actions() == [f"choose[color={task[1]}]", f"choose[size={task[2]}]"]
        env.step(f"choose[size={task[2]}]")
        assert env.expert_actions() == [f"choose[color={task[1]}]"]
        env.step(f"choose[color={task[1]}]")
        assert env.expert_actions() == ["buy"]
        _, r, done, info = env.step("buy")
        assert done and info["success"] and r == 1.0
    # on the wrong item's page the only optimal move is back
    env.reset(task=env.tasks[0])
    other = [n for n in env.items if n != env.tasks[0][0]][0]
    env.step(f"search[{env.categories[0]}]")
    env.step(f"click[{other}]")
    assert env.expert_actions() == ["back"]


def test_expert_policy_always_succeeds_and_short_observations():
    from agentrl_lib.algorithms.sft import scripted_policy

    env = ShopEnv(make_catalog(2, 2, 2, 2, 2, seed=0), max_turns=6, obs_format="short")
    mk = lambda: ShopEnv(env.catalog, max_turns=6, obs_format="short")  # noqa: E731
    eps = play_episodes(mk, scripted_policy(0.0, np.random.default_rng(0)), list(range(32)), 1)
    assert all(e.success and len(e) == 5 for e in eps)
    first = env.reset(task=("glass-shirt", "blue", "small"))
    assert first == "want glass shirt blue small. search"
    assert env.step("search[shirt]")[0] == "results: glass-shirt plastic-shirt"
    assert env.step("click[glass-shirt]")[0] == "item glass-shirt got - -"
    assert env.step("choose[size=small]")[0] == "item glass-shirt got - small"
    assert env.step("search[mug]")[0] == "invalid. item glass-shirt got - small"
    assert ShopEnv.system_prompt and env.obs_format == "short"


def test_relative_features_one_hot_blocks():
    env = tiny_env()
    task = env.tasks[0]
    s = (task, "search", None, None, None, None)
    f = env.relative_features(s, f"search[{env.categories[0]}]")
    assert f.shape == (25,) and f.sum() == 6.0  # one 1 per block
    # page=search, found=False, on_target=False, colour none, size none, search[target]
    assert np.flatnonzero(f).tolist() == [0, 4, 6, 8, 11, 14]
    assert env.relative_features(s, "choose[colour]")[-1] == 1.0  # unreadable -> 'invalid'


def test_shop_agent_base_config_and_its_demonstrations_fit_the_context():
    from agentrl_lib.algorithms.sft import BASE_MODELS, AgentSFTConfig, scripted_policy
    from agentrl_lib.envs import make_agent_env
    from agentrl_lib.models.tiny_lm import char_tokenizer
    from agentrl_lib.rollout import text_episodes_to_tokens

    cfg = BASE_MODELS["shop-agent-tiny"]
    assert isinstance(cfg, AgentSFTConfig) and cfg.env == "shop"
    assert cfg.system_prompt == ShopEnv.system_prompt and cfg.max_turns == cfg.env_kwargs["max_turns"]
    mk = lambda: make_agent_env(cfg.env, **cfg.env_kwargs)  # noqa: E731
    eps = play_episodes(mk, scripted_policy(cfg.epsilon, np.random.default_rng(0)),
                        [cfg.seed_offset + i for i in range(64)], 1, cfg.max_turns)
    text_episodes_to_tokens(char_tokenizer(), eps, cfg.system_prompt)
    lengths = [len(e.prompt_ids) + len(e.token_ids) for e in eps]
    assert max(lengths) <= 512  # the tiny LM's positions
    assert 0.5 < np.mean([e.success for e in eps]) < 1.0  # noisy demonstrations, mostly right


def test_expert_q_equals_dp_value_iteration():
    from agentrl_lib.envs import shop

    env = ShopEnv(gamma=0.95)
    env.reset(seed=3)
    env.expert_actions()
    q_env, index = [v for k, v in shop._Q_CACHE.items() if k[-1] == env.task][0]
    mdp, keys = env.tabular_form(env.task)
    v, _, _, _ = dp.value_iteration(mdp)
    assert np.allclose(q_env, dp.q_from_v(mdp, v).numpy(), atol=1e-9)
    assert index[keys[0]] == 0
