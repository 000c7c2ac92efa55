"""A multi-turn environment for TRL's ``GRPOTrainer`` (1.16) through its environment/tool API.

TRL's multi-turn path (``environment_factory``): for every rollout TRL builds one environment
instance (``factory()``), calls ``reset(**row)`` with the data set row (the returned string is
appended to the last user message), exposes every public method of the instance as a *tool*
(schema from type hints and the Google-style docstring, rendered into the prompt by the chat
template), parses the model's tool calls from its completion, runs them and appends the results as
``tool`` messages, then generates again, up to ``max_tool_calling_iterations`` times. A
``get_reward()`` method, when present, is a reward source: called once per finished rollout.

Here the tool is ``move(direction)``: one ``env.step(direction)`` of our environment, returning the
next observation; ``get_reward()`` returns the episode's return (``sum_t r_t``, the same reward our
``agent_lm`` loop trains on). A move after the episode ended, or an unknown direction, returns the
environment's text (the error path: ``GridAgentEnv`` never raises on a malformed action).

**The chat template.** TRL refuses a template that cannot render a tool-calling conversation
(``supports_tool_calling``: the assistant's ``tool_calls`` and the ``tool`` role must appear in the
rendering) and needs a parser for the model's tool calls (``add_response_schema`` knows only the
templates it ships). The tiny LM's ChatML template (``tiny_lm.CHAT_TEMPLATE``) renders ``role`` and
``content`` only: no ``tools`` block in the system prompt, no ``tool_calls``, no ``tool`` role, so
TRL raises ``ValueError: The provided chat template does not support tool calling``. The fix needs
nothing from the hub: ``tool_tokenizer`` gives a copy of the character tokenizer whose template is
TRL's bundled Qwen2.5 template (``trl/chat_templates/qwen2_5.jinja``: the same ChatML markers
``<|im_start|>``/``<|im_end|>``, plus tools in the system prompt, ``<tool_call>{json}</tool_call>``
in assistant turns and ``<tool_response>`` in user turns); every character it uses is in the
tokenizer's vocabulary, and TRL parses tool calls with its Qwen3 response template. The tiny LM
still has to learn to *write* tool calls: ``tool_sft`` is a short warm-start on a scripted policy's
conversations rendered with that template.

Differences to our loop (``agent_lm.train_agent``), by TRL's design: the whole multi-turn exchange
is one "completion" (tool results masked out of the loss by TRL's ``tool_mask``) bounded by
``max_completion_length`` in total, and the prompt carries the tool schema (about 700 characters).
"""

from __future__ import annotations

import copy

from agentrl_lib.algorithms.grpo import GRPOConfig

INSTRUCTION = "Reach the goal in the grid. Call the move tool once per turn."


def tool_tokenizer(tokenizer):
    """A copy of ``tokenizer`` with TRL's bundled Qwen2.5 tool-calling chat template (offline)."""
    from trl.chat_template_utils import qwen2_5_chat_template, supports_tool_calling

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = qwen2_5_chat_template
    if not supports_tool_calling(tok):
        raise ValueError("the Qwen2.5 template does not render tool calls with this tokenizer")
    return tok


class GridToolEnv:
    """One rollout's environment, as TRL's ``environment_factory`` wants it: ``reset``, the tool
    ``move`` and ``get_reward``. Build through ``environment_factory(make_env)``."""

    def __init__(self, env):
        self._env = env
        self._done = False
        self._return = 0.0
        self.turns = 0
        self.num_calls = 0

    def reset(self, seed: int | None = None, **kwargs) -> str:
        """TRL calls this with the data set row; the observation is appended to the user message."""
        obs = self._env.reset(seed=None if seed is None else int(seed))
        self._done, self._return, self.turns = False, 0.0, 0
        return "\n" + obs

    def move(self, direction: str) -> str:
        """Move one cell in the grid.

        Args:
            direction: The move: up, down, left or right.

        Returns:
            What the agent sees after the move.
        """
        self.num_calls += 1
        if self._done:
            return "The episode is over."
        obs, r, done, info = self._env.step(str(direction))
        self.turns += 1
        self._return += float(r)
        self._done = bool(done)
        return obs

    def get_reward(self) -> float:
        """The episode's return sum_t r_t (1 for reaching the goal in GridAgentEnv's default)."""
        return self._return


def environment_factory(make_env):
    """The zero-argument factory TRL calls once per rollout."""
    return lambda: GridToolEnv(make_env())


def to_env_dataset(seeds: list[int], instruction: str = INSTRUCTION):
    """One row per task seed: a one-message conversation and the ``seed`` column (given to reset)."""
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": instruction}], "seed": int(s)}
                              for s in seeds])


def tool_conversation(env, seed: int, actions: list[str], instruction: str = INSTRUCTION):
    """The messages of one scripted episode in TRL's format (tool calls and tool results)."""
    msgs = [{"role": "user", "content": instruction + "\n" + env.reset(seed=seed)}]
    for a in actions:
        call = {"type": "function", "function": {"name": "move", "arguments": {"direction": a}}}
        msgs.append({"role": "assistant", "content": "", "tool_calls": [call]})
        obs, _, done, _ = env.step(a)
        msgs.append({"role": "tool", "name": "move", "content": obs})
        if done:
            break
    return msgs


def tool_sft(model, tokenizer, make_env, seeds: list[int], epsilon: float = 0.3, steps: int = 60,
             batch_size: int = 8, lr: float = 3e-3, max_turns: int = 4, seed: int = 0,
             instruction: str = INSTRUCTION) -> list[float]:
    """Teach the tiny LM the tool-call format: next-token loss on the assistant turns of a noisy
    scripted policy's conversations rendered with ``tokenizer``'s (tool) template and the move
    tool's schema. Trains ``model`` in place; returns the losses."""
    import numpy as np
    import torch

    from agentrl_lib.agent_lm import scripted_policy
    from agentrl_lib.models.sft import masked_nll
    from agentrl_lib.rollout import play_episodes

    rng = np.random.default_rng(seed)
    eps = play_episodes(make_env, scripted_policy(epsilon, rng), seeds, 1, max_turns)
    tools = [GridToolEnv(make_env()).move]
    head = len(tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"])
    examples = []
    for s, ep in zip(seeds, eps):
        msgs = tool_conversation(make_env(), s, ep.actions, instruction)
        ids, mask = [], []
        for k in range(1, len(msgs) + 1):  # mask: the tokens each assistant message adds
            text = tokenizer.apply_chat_template(msgs[:k], tools=tools, tokenize=False)
            new = tokenizer(text, add_special_tokens=False)["input_ids"][len(ids):]
            ids += new
            if msgs[k - 1]["role"] != "assistant":
                mask += [0] * len(new)
            else:  # '<|im_start|>assistant\n' | the tool call and <|im_end|> (trained) | '\n'
                mask += [0] * head + [1] * (len(new) - head - 1) + [0]
        examples.append((ids, mask))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    order = np.random.default_rng(seed + 1)
    model.train()
    for _ in range(steps):
        batch = [examples[j] for j in order.choice(len(examples), batch_size, replace=False)]
        loss = masked_nll(model, batch, tokenizer.pad_token_id)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    model.eval()
    return losses


def make_env_trainer(model, tokenizer, make_env, train_seeds: list[int], cfg: GRPOConfig,
                     output_dir: str, max_turns: int = 4, max_completion_length: int = 512,
                     device: str = "cpu", callbacks=None, instruction: str = INSTRUCTION,
                     **overrides):
    """A ``trl.GRPOTrainer`` on the multi-turn environment: our ``GRPOConfig`` mapped by
    ``trl_adapter.to_trl_config`` (one optimizer step per round of ``num_prompts x group_size``
    rollouts), ``max_tool_calling_iterations = max_turns - 1`` (the first move comes with the first
    generation), and ``max_completion_length`` for the whole exchange. ``tokenizer`` must carry a
    tool-calling template (``tool_tokenizer``). Returns the trainer."""
    from transformers import PrinterCallback
    from trl import GRPOTrainer

    from agentrl_lib.algorithms.trl_adapter import to_trl_config

    kw = dict(max_tool_calling_iterations=max(max_turns - 1, 0),
              max_completion_length=max_completion_length)
    kw.update(overrides)
    args = to_trl_config(cfg, output_dir, device=device, **kw)
    trainer = GRPOTrainer(model=model, reward_funcs=None, args=args,
                          train_dataset=to_env_dataset(train_seeds, instruction),
                          processing_class=tokenizer, environment_factory=environment_factory(make_env),
                          callbacks=list(callbacks or []))
    trainer.remove_callback(PrinterCallback)
    return trainer
