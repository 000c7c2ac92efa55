"""The project's subword tokenizer: the corpus it is trained on, the training, and the shipped files.

A byte-level BPE (Sennrich et al. 2016, "Neural Machine Translation of Rare Words with Subword
Units"; the byte-level alphabet of GPT-2) trained with Hugging Face ``tokenizers`` on the project's
own text, rendered exactly as the models will read it:
- every LM environment's conversations (``CORPUS_ENVS``: the grids, key-door, the memory grid,
  TwentyQuestions, ShopEnv, CalcToolEnv, the KG search / menu / JUDGE / team environments), played
  by the scripted policy of ``sft.scripted_policy`` at epsilon 0.3 (invalid actions and their error
  observations included), in the chat template;
- the text tasks' prompts with their worked reference completions at difficulties 1-4, and the
  direct ``answer N`` form;
- TRL tool-call conversations (``envs.tool_env``): the JSON calls of the Qwen2.5 tool template.

Choices, each ours (inferred for a 0.1M-parameter model, not from a paper):
- **digits one per token** (as Qwen's and Llama 1/2's pre-tokenizers do; Llama 3 groups up to
  three digits; "so arithmetic stays learnable": a number's digits are always the same tokens) and
  newlines split off;
- **merges across words** (no whitespace pre-split, as SentencePiece with
  ``split_by_whitespace=False``): the environments repeat fixed phrases (". The goal is at row "),
  and one token per phrase is where most of the saving comes from; a token is at most
  ``MAX_TOKEN_CHARS`` characters;
- **2048 tokens** (``VOCAB_SIZE``): the corpus saturates near there (4096 adds tokens only for the
  KG environments' names) while the output layer of a hidden-64 model already costs more than its
  two transformer blocks at 2048;
- the chat template is TRL's bundled Qwen2.5 template verbatim (``trl.chat_template_utils``), the
  one TRL's ``environment_factory`` path recognises (``add_response_schema`` matches templates by
  equality) and prefix-preserving; it adds Qwen's default system message when a conversation has
  none, which the corpus therefore contains.

``build()`` regenerates ``models/bpe/`` deterministically (same corpus, same merges); the test
suite checks the shipped files are what it writes. ``agentrl tokenizer --rebuild`` runs it.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from agentrl_lib.algorithms.sft import (CALC_AGENT_GAME, GRID5, KG_AGENT_GAME, TQ_AGENT_GAME,
                                        scripted_policy)
from agentrl_lib.envs import tool_env
from agentrl_lib.envs.calc_tool import CalcToolEnv
from agentrl_lib.envs.kg_judge import KGJudgeEnv, KGJudgeMenuEnv
from agentrl_lib.envs.kg_search import KGMenuEnv, KGSearchEnv
from agentrl_lib.envs.kg_team import KGTeamEnv
from agentrl_lib.envs.memory_grid import MemoryGridEnv
from agentrl_lib.envs.multiturn import GridAgentEnv, SubtaskGridEnv
from agentrl_lib.envs.shop import ShopEnv, make_catalog
from agentrl_lib.envs.text_tasks import GENERATORS, make_problems, reference_completion
from agentrl_lib.envs.twenty_questions import TwentyQuestionsEnv
from agentrl_lib.models.tiny_lm import BPE_DIR, BPE_SPECIAL_TOKENS, char_tokenizer
from agentrl_lib.rollout import observation_text, play_episodes, prompt_text

VOCAB_SIZE = 2048
MAX_TOKEN_CHARS = 24
PRE_SPLIT = r"\p{N}|\n"
"""isolated before BPE: each digit and each newline is its own token"""
_KG = dict(num_entities=100, num_relations=2)
CORPUS_ENVS = {
    "grid": lambda: GridAgentEnv(max_turns=6),
    "grid5": lambda: GridAgentEnv(layout=GRID5, max_turns=10),
    "grid_5x5_memory": lambda: GridAgentEnv("5x5", memory=True, show_walls=False, slip=0.2,
                                            max_turns=8),
    "memory_grid": lambda: MemoryGridEnv(max_turns=8),
    "keydoor": lambda: SubtaskGridEnv("keydoor", max_turns=40),
    "abc": lambda: SubtaskGridEnv("abc"),
    "chain3": lambda: SubtaskGridEnv("chain3"),
    "twenty_questions": lambda: TwentyQuestionsEnv(max_turns=6),
    "tq_brief": lambda: TwentyQuestionsEnv(**TQ_AGENT_GAME),
    "shop": lambda: ShopEnv(max_turns=8),
    "shop_short": lambda: ShopEnv(catalog=make_catalog(2, 2, 2, 2, 2, seed=0), max_turns=6,
                                  obs_format="short"),
    "kg_search": lambda: KGSearchEnv(**KG_AGENT_GAME),
    "kg_menu": lambda: KGMenuEnv(**_KG, max_turns=6),
    "kg_judge": lambda: KGJudgeEnv(**_KG, max_turns=6, decoy_first=0.5),
    "kg_search_long": lambda: KGJudgeEnv(judge=False, **_KG, max_turns=6),
    "kg_judge_menu": lambda: KGJudgeMenuEnv(**_KG, max_turns=6, decoy_first=0.5),
    "kg_team": lambda: KGTeamEnv(**_KG),
    "calc_tool": lambda: CalcToolEnv(max_turns=6, confirm_prob=0.5),
    "calc_agent": lambda: CalcToolEnv(**CALC_AGENT_GAME),
}
"""the environments whose conversations the tokenizer is trained on, by name (CalcCruxEnv's text
is CalcToolEnv's "order" template, already here)"""


def template_tokenizer():
    """A tokenizer that renders TRL's Qwen2.5 chat template (the character one: rendering text
    needs only the template)."""
    from trl.chat_template_utils import qwen2_5_chat_template

    tok = char_tokenizer()
    tok.chat_template = qwen2_5_chat_template
    return tok


def conversation_text(tok, episode, system_prompt: str) -> str:
    """An episode as the model reads it: the first prompt, then each action + eos and the next
    observation's template text (``rollout.prompt_text`` / ``observation_text``)."""
    parts = [prompt_text(tok, episode.observations[0], system_prompt)]
    for t, action in enumerate(episode.actions):
        if t > 0:
            parts.append(observation_text(tok, episode.observations[t], system_prompt))
        parts.append(action + tok.eos_token)
    return "".join(parts)


def env_episodes(name: str, n: int, seed: int = 0):
    """``n`` scripted episodes (epsilon 0.3) of ``CORPUS_ENVS[name]`` on task seeds from 5e6."""
    make_env = CORPUS_ENVS[name]
    return play_episodes(make_env, scripted_policy(0.3, np.random.default_rng(seed)),
                         [5_000_000 + i for i in range(n)], 1, make_env().max_turns)


def corpus(episodes: int = 200, problems: int = 300, seed: int = 0) -> dict[str, list[str]]:
    """{corpus name: texts}: each environment's conversations, each text task's chats (reference
    completions, plus the ``answer N`` form), and grid tool-call conversations in the template."""
    tok = template_tokenizer()
    out = {}
    for name, make_env in CORPUS_ENVS.items():
        system = getattr(make_env(), "system_prompt", "")
        out[name] = [conversation_text(tok, ep, system) for ep in env_episodes(name, episodes, seed)]
    for task in GENERATORS:
        out[task] = []
        for d in (1, 2, 3, 4):
            for p in make_problems(task, problems, d, "train", seed=seed, strict=False):
                chat = tok.apply_chat_template([{"role": "user", "content": p["prompt"]}],
                                               add_generation_prompt=True, tokenize=False)
                out[task] += [chat + reference_completion(p) + tok.eos_token,
                              chat + f"answer {p['answer']}" + tok.eos_token]
    make_grid = CORPUS_ENVS["grid"]
    tools = [tool_env.GridToolEnv(make_grid()).move]
    out["tool_calls"] = [
        tok.apply_chat_template(tool_env.tool_conversation(make_grid(), s, ep.actions), tools=tools,
                                tokenize=False)
        for s, ep in zip(range(5_000_000, 5_000_000 + episodes), env_episodes("grid", episodes, seed))]
    return out


def train_bpe(texts: list[str], vocab_size: int = VOCAB_SIZE):
    """A byte-level BPE ``tokenizers.Tokenizer`` trained on ``texts`` (module docstring). The
    texts are cut at the special tokens first: encoding splits those off before BPE runs, so
    training must not spend merges on them (or on the words glued to them)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    core = Tokenizer(models.BPE())
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=BPE_SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  min_frequency=2, max_token_length=MAX_TOKEN_CHARS,
                                  show_progress=False)
    specials = re.compile("|".join(re.escape(t) for t in BPE_SPECIAL_TOKENS))
    core.train_from_iterator((piece for text in texts for piece in specials.split(text) if piece),
                             trainer)
    return core


def build(path: Path = BPE_DIR, episodes: int = 200, problems: int = 300) -> Path:
    """Train the tokenizer on ``corpus()`` and write ``tokenizer.json`` and
    ``chat_template.jinja`` to ``path`` (by default the shipped folder)."""
    from trl.chat_template_utils import qwen2_5_chat_template

    texts = [t for group in corpus(episodes, problems).values() for t in group]
    core = train_bpe(texts)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "tokenizer.json").write_text(core.to_str(pretty=True) + "\n")
    (path / "chat_template.jinja").write_text(qwen2_5_chat_template)
    return path
