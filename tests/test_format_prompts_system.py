"""``rollout.format_prompts`` with a problem's ``system_prompt``: an agent base's first prompt."""
from agentrl_lib.models.tiny_lm import load_tokenizer
from agentrl_lib.rollout import format_prompts, prompt_text


def test_system_prompt_renders_the_agent_first_prompt():
    tok = load_tokenizer("bpe")
    sys_ = 'Answer each turn with one tool call, name(arg="value").'
    obs = "User: What is 2 plus 3?"
    got = format_prompts(tok, [{"prompt": obs, "system_prompt": sys_}, {"prompt": obs}])
    assert got[0] == prompt_text(tok, obs, sys_)
    assert got[0] == tok.apply_chat_template(
        [{"role": "system", "content": sys_}, {"role": "user", "content": obs}],
        add_generation_prompt=True, tokenize=False)
    assert sys_ in got[0] and sys_ not in got[1]
    # no (or an empty) system prompt: the one-message chat as before
    plain = tok.apply_chat_template([{"role": "user", "content": obs}],
                                    add_generation_prompt=True, tokenize=False)
    assert got[1] == plain
    assert format_prompts(tok, [{"prompt": obs, "system_prompt": ""}]) == [plain]
