"""The multi-turn side of the TRL adapter: what the tiny tokenizer's template lacks for TRL's tool
path, the tool template that fixes it offline, the environment object TRL drives
(``envs.tool_env``: reset / move / get_reward), the tool-format SFT mask, and a real GRPOTrainer
step through ``environment_factory``."""

import os
import tempfile

import pytest
import torch

pytest.importorskip("trl")

from agentrl_lib.algorithms import trl_adapter  # noqa: E402
from agentrl_lib.algorithms.grpo import GRPOConfig  # noqa: E402
from agentrl_lib.envs import tool_env  # noqa: E402
from agentrl_lib.envs.multiturn import GridAgentEnv  # noqa: E402
from agentrl_lib.models.tiny_lm import char_tokenizer, new_model  # noqa: E402

LAYOUT = ["...", ".#.", "..."]


def make_env():
    return GridAgentEnv(layout=LAYOUT, max_turns=3)


def test_char_template_lacks_tool_support_and_the_tool_template_has_it():
    from trl.chat_template_utils import supports_tool_calling

    tok = char_tokenizer()
    assert not supports_tool_calling(tok)  # role + content only: tool_calls and the tool role vanish
    ttok = trl_adapter.tool_tokenizer(tok)
    assert supports_tool_calling(ttok) and tok.chat_template != ttok.chat_template
    msgs = tool_env.tool_conversation(make_env(), 0, ["up", "left", "down"])
    text = ttok.apply_chat_template(msgs, tools=[tool_env.GridToolEnv(make_env()).move], tokenize=False)
    assert '"name": "move"' in text and "<tool_response>" in text and '"direction"' in text
    ids = ttok(text, add_special_tokens=False)["input_ids"]
    assert ttok.unk_token_id not in ids  # every character is in the char vocabulary
    assert ttok.decode(ids) == text


def test_tool_calls_parse_with_the_char_tokenizer():
    from trl.chat_template_utils import add_response_schema, parse_response

    ttok = add_response_schema(trl_adapter.tool_tokenizer(char_tokenizer()))
    call = '<tool_call>\n{"name": "move", "arguments": {"direction": "left"}}\n</tool_call><|im_end|>'
    prefix = ttok("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
                  add_special_tokens=False)["input_ids"]
    parsed = parse_response(ttok, ttok(call, add_special_tokens=False)["input_ids"], prefix=prefix)
    assert parsed["tool_calls"][0]["function"] == {"name": "move", "arguments": {"direction": "left"}}


def test_environment_object():
    env = tool_env.environment_factory(make_env)()
    obs = env.reset(seed=3, prompt=[{"role": "user", "content": "x"}])
    ref = make_env()
    assert obs == "\n" + ref.reset(seed=3)
    # a malformed direction goes through the env's error path and costs a turn
    assert env.move("sideways").startswith("Invalid action")
    assert env.get_reward() == 0.0 and env.turns == 1
    # the rest of the episode: the same moves on a reference env give the same observations
    ref.step("sideways")
    done, total = False, 0.0
    while not done:  # the env's turn cap (3) ends it
        move = ref.actions[(ref.state_index() + ref.turn) % 4]
        o_ref, r, done, _ = ref.step(move)
        total += r
        assert env.move(move) == o_ref
    assert env.get_reward() == total
    assert env.move("up") == "The episode is over."
    # only `move` is public: TRL exposes public methods as tools
    import inspect
    public = [n for n, _ in inspect.getmembers(tool_env.GridToolEnv, inspect.isfunction)
              if not n.startswith("_") and n not in ("reset", "get_reward")]
    assert public == ["move"]


def test_tool_sft_mask_is_the_tool_call():
    model, tok = new_model("tiny-64", seed=0)
    ttok = trl_adapter.tool_tokenizer(tok)
    before = [p.detach().clone() for p in model.parameters()]
    losses = trl_adapter.tool_sft(model, ttok, make_env, list(range(8)), steps=2, batch_size=2, max_turns=2)
    assert len(losses) == 2 and all(l > 0 for l in losses)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))


def two_trl_steps(wrapper_cls, make, seeds, **kw):
    """Two real TRL optimizer steps through environment_factory on a tiny random model, spying on
    the seeds TRL resets ``wrapper_cls`` with. Returns (trainer, seeds seen)."""
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    model, tok = new_model("tiny-64", seed=0)
    ttok = trl_adapter.tool_tokenizer(tok)
    seeds_seen = []
    orig_reset = wrapper_cls.reset

    def spy_reset(self, seed=None, **kw):
        seeds_seen.append(seed)
        return orig_reset(self, seed=seed, **kw)

    wrapper_cls.reset = spy_reset
    try:
        cfg = GRPOConfig(num_prompts=1, group_size=2, num_iters=2, lr=1e-3, max_new_tokens=8,
                         max_turns=2)
        trainer = trl_adapter.make_env_trainer(model, ttok, make, seeds, cfg, tempfile.mkdtemp(),
                                               max_completion_length=24, **kw)
        trainer.train()
    finally:
        wrapper_cls.reset = orig_reset
    return trainer, seeds_seen


def test_grpo_trainer_runs_through_environment_factory():
    """Two real TRL optimizer steps on a tiny random model: TRL resets our environment with each
    row's seed, and the environment's get_reward is a reward source logged under its class name."""
    trainer, seeds_seen = two_trl_steps(tool_env.GridToolEnv, make_env, [11, 12, 13])
    assert trainer.state.global_step == 2
    rows = [r for r in trainer.state.log_history if "reward" in r]
    assert len(rows) == 2 and all("rewards/GridToolEnv/mean" in r for r in rows)
    assert set(seeds_seen) <= {11, 12, 13} and len(seeds_seen) == 4  # 2 steps x 2 rollouts


def make_kg_env():
    from agentrl_lib.envs.kg_search import KGSearchEnv
    return KGSearchEnv(num_entities=60, hops=(1,), max_turns=4)


def test_kg_tool_object_routes_each_tool_to_one_env_step():
    """KGToolEnv: each tool call is one step of the call's text on KGSearchEnv (the scripted
    searcher through the tools gets the same observations and reward as on the environment), a
    malformed argument goes through the env's error path, and the public methods are the tools."""
    import inspect

    env = tool_env.environment_factory(make_kg_env, tool_env.KGToolEnv)()
    ref = make_kg_env()
    assert env.reset(seed=5, prompt=[{"role": "user", "content": "x"}]) == "\n" + ref.reset(seed=5)
    assert env.open("d999999").startswith("Error: no document") and ref.step("open(d999999)")
    while True:
        call = ref.expert_actions()[0]
        tool, arg = call[:call.index("(")], call[call.index("(") + 1:-1]
        o_ref, r, done, _ = ref.step(call)
        assert getattr(env, tool)(arg) == o_ref
        if done:
            break
    assert tool == "answer" and env.get_reward() == 1.0 and env.turns == 4
    assert env.search("anything") == "The episode is over."
    public = [n for n, _ in inspect.getmembers(tool_env.KGToolEnv, inspect.isfunction)
              if not n.startswith("_") and n not in ("reset", "get_reward")]
    assert sorted(public) == ["answer", "open", "search"]


def test_grpo_trainer_runs_on_the_search_environment():
    """Two real TRL optimizer steps through environment_factory on KGSearchEnv: the three tools
    reach TRL's tool schema, TRL resets our environment with each row's seed, and the reward of
    KGToolEnv is logged under its class name."""
    trainer, seeds_seen = two_trl_steps(tool_env.KGToolEnv, make_kg_env, [21, 22, 23],
                                        instruction=tool_env.KG_INSTRUCTION,
                                        wrapper=tool_env.KGToolEnv)
    assert trainer.state.global_step == 2
    assert sorted(t.__name__ for t in trainer.tools) == ["answer", "open", "search"]
    rows = [r for r in trainer.state.log_history if "reward" in r]
    assert len(rows) == 2 and all("rewards/KGToolEnv/mean" in r for r in rows)
    assert set(seeds_seen) <= {21, 22, 23} and len(seeds_seen) == 4  # 2 steps x 2 rollouts
