"""Run our GRPO configuration through TRL's ``GRPOTrainer`` (1.16), single-turn and multi-turn:
the config mapping, the data sets, a callback that evaluates a held-out panel at fixed steps, and
the multi-turn environment trainer (``environment_factory``) with its tool-calling template.

``to_trl_config(cfg)`` builds a ``trl.GRPOConfig`` that makes TRL (1.16) do what ``grpo.train`` does
with ``cfg``: one generation round of ``num_prompts x group_size`` completions per optimizer step,
the same advantage (``scale_rewards``), the same aggregation (``loss_type``), clip range, KL weight,
learning rate (constant, no warm-up, AdamW without weight decay, as our loop), gradient clipping,
sampling temperature and completion length. ``from_trl_config`` inverts it, so a round trip
returns the same ``GRPOConfig``.

What TRL does not have raises ``ValueError`` naming the field (see ``TRL_FIXED`` and
``UNSUPPORTED_ESTIMATORS``); nothing is silently dropped:
- std with ddof=1 and the k3 KL estimator are the only choices TRL implements;
- dynamic sampling and DAPO's soft overlong punishment are not GRPOTrainer options;
- the 'reinforce', 'batch_mean', 'rloo' and 'reinforce_pp' estimators belong to other trainers,
  and the turn-level ones (``turn_credit.TURN_ESTIMATORS`` but 'grpo': 'gigpo', 'turn_gae', ...,
  with ``gamma``, ``omega``, ``lam``, ...) to none;
- ``clip='cispo'`` is TRL's ``loss_type="cispo"``, which aggregates as 'token_mean' and has no
  lower bound (so ``clip_eps >= 1``); TRL caps rho itself, so its ``epsilon_high`` is
  1 + ``clip_eps_high`` (the round trip is exact where that sum is; ``clip_eps_high=None`` means
  1 + ``clip_eps``, which TRL cannot express as None);
- ``overlong_filter`` maps to ``mask_truncated_completions`` only with ``loss_agg='token_mean'``:
  TRL zeroes the mask of a truncated row but keeps the row in the batch, so 'seq_mean' and
  'const_norm' would divide by a different count than our loop, which drops the row.

Aggregation names: ``seq_mean`` = TRL "grpo", ``token_mean`` = "bnpo" (equal to "dapo" with one
process and no gradient accumulation), ``const_norm`` = "dr_grpo" (checked in tests/test_grpo.py);
``is_level`` is ``importance_sampling_level``.

**Multi-turn** (``make_env_trainer``): TRL builds one environment per rollout through
``environment_factory`` (``envs.tool_env``: the tool ``move(direction)`` is one step of our
environment, ``get_reward()`` the episode's return), runs the model's tool calls and appends the
results as ``tool`` messages, up to ``max_tool_calling_iterations`` times. TRL refuses a chat
template that cannot render a tool-calling conversation and parses tool calls only with the
templates it ships; the tiny LM's ChatML template renders ``role`` and ``content`` only. The fix
needs nothing from the hub: ``tool_tokenizer`` gives a copy of the character tokenizer whose
template is TRL's bundled Qwen2.5 template (``trl/chat_templates/qwen2_5.jinja``: the same ChatML
markers, plus tools in the system prompt, ``<tool_call>{json}</tool_call>`` in assistant turns and
``<tool_response>`` in user turns); every character it uses is in the vocabulary. The tiny LM
still has to learn to *write* tool calls: ``tool_sft`` is a short warm-start on a scripted
policy's conversations rendered with that template. Differences to ``grpo.train`` with
``grpo.episode_sampler``, by TRL's design: the whole multi-turn exchange is one "completion" (tool
results masked out of the loss by TRL's ``tool_mask``) bounded by ``max_completion_length`` in
total, and the prompt carries the tool schema (about 700 characters).
"""

from __future__ import annotations

import copy
import time
from dataclasses import fields

from transformers import TrainerCallback

from agentrl_lib import tblog
from agentrl_lib.algorithms.grpo import GRPOConfig
from agentrl_lib.algorithms.sft import fit, masked_nll, scripted_policy
from agentrl_lib.algorithms.turn_credit import TURN_ESTIMATORS
from agentrl_lib.core import ESTIMATORS
from agentrl_lib.envs.tool_env import INSTRUCTION, GridToolEnv, environment_factory, \
    tool_conversation
from agentrl_lib.rollout import messages_example, model_device, play_episodes

LOSS_TYPES = {"seq_mean": "grpo", "token_mean": "bnpo", "const_norm": "dr_grpo"}
SCALE_REWARDS = {"grpo": "group", "dr_grpo": "none", "lite_ppo": "batch"}
# Every estimator (single-turn core.ESTIMATORS, then the multi-turn turn_credit list) that is not
# a scale_rewards setting: the other single-turn ones belong to other trainers, the turn-level
# ones to none.
UNSUPPORTED_ESTIMATORS = tuple(e for e in dict.fromkeys((*ESTIMATORS, *TURN_ESTIMATORS))
                               if e not in SCALE_REWARDS)
# Our fields whose value TRL's GRPOTrainer fixes: a config must hold exactly this value.
TRL_FIXED = {"std_ddof": 1, "kl_estimator": "k3", "dynamic_sampling": False, "overlong_buffer": 0,
             "overlong_penalty": 1.0, "gamma": 0.95, "omega": 1.0, "entropy_coef": 0.0,
             "horizon_schedule": None, "max_context": None, "norm_adv": True, "lam": 0.95,
             "hgpo_depth": 2, "segment_len": None, "critic_lr": 0.5, "max_num_gen_batches": 1,
             "max_groups": None, "whiten_adv": False, "adv_clip": None, "dual_clip": None,
             "kl_in_reward": False, "adv_eps": 1e-4, "invalid_penalty": 0.0,
             "cross_steps": False}
# Our fields with a TRL counterpart (ours -> TRL's GRPOConfig / TrainingArguments).
MAPPED = {"estimator": "scale_rewards", "loss_agg": "loss_type", "clip_eps": "epsilon",
          "clip_eps_high": "epsilon_high", "beta": "beta",
          "is_level": "importance_sampling_level", "clip": "loss_type",
          "num_prompts": "per_device_train_batch_size",
          "group_size": "num_generations", "num_iters": "max_steps",
          "num_epochs": "num_iterations", "lr": "learning_rate",
          "max_new_tokens": "max_completion_length", "temperature": "temperature",
          "max_grad_norm": "max_grad_norm", "seed": "seed",
          "overlong_filter": "mask_truncated_completions", "report_to": "report_to"}
# Fields of the loop around the update, not of the update: the eval callback takes eval_every;
# make_env_trainer turns max_turns into max_tool_calling_iterations = max_turns - 1; TRL's
# TensorBoard callback writes under output_dir (or $TENSORBOARD_LOGGING_DIR), not logging_dir.
LOOP_ONLY = ("eval_every", "max_turns", "logging_dir")


def check_supported(cfg: GRPOConfig) -> None:
    """Raise ValueError for any setting TRL's GRPOTrainer cannot reproduce."""
    for name, value in TRL_FIXED.items():
        if getattr(cfg, name) != value:
            raise ValueError(f"TRL's GRPOTrainer has no {name}={getattr(cfg, name)!r}; "
                             f"it implements only {name}={value!r}")
    if cfg.estimator in UNSUPPORTED_ESTIMATORS:
        raise ValueError(f"estimator {cfg.estimator!r} is not a GRPOTrainer option; it supports "
                         f"{sorted(SCALE_REWARDS)} (scale_rewards group/none/batch)")
    if cfg.overlong_filter and cfg.loss_agg != "token_mean":
        raise ValueError("overlong_filter maps to TRL's mask_truncated_completions only with "
                         "loss_agg='token_mean' (TRL keeps masked rows in the per-sequence mean)")
    if cfg.clip == "cispo" and (cfg.loss_agg != "token_mean" or cfg.clip_eps < 1.0
                                or cfg.clip_eps_high is None):
        raise ValueError("clip='cispo' maps to TRL's loss_type='cispo' only with "
                         "loss_agg='token_mean', clip_eps >= 1 (TRL has no lower bound) and "
                         "clip_eps_high set (TRL's epsilon_high = 1 + clip_eps_high)")


def to_trl_config(cfg: GRPOConfig, output_dir: str, device: str = "cpu", **overrides):
    """The ``trl.GRPOConfig`` equal to ``cfg``; ``overrides`` go to TRL's config last.

    One optimizer step per generation round: per-device batch = num_prompts * group_size
    completions, gradient_accumulation_steps = steps_per_generation = 1.
    """
    from trl import GRPOConfig as TRLGRPOConfig

    check_supported(cfg)
    kwargs = dict(
        output_dir=output_dir,
        # the update
        learning_rate=cfg.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8,  # torch.optim.AdamW defaults, as ours
        max_grad_norm=cfg.max_grad_norm, max_steps=cfg.num_iters,
        num_iterations=cfg.num_epochs,
        per_device_train_batch_size=cfg.num_prompts * cfg.group_size, gradient_accumulation_steps=1,
        steps_per_generation=1, num_generations=cfg.group_size,
        scale_rewards=SCALE_REWARDS[cfg.estimator], beta=cfg.beta,
        importance_sampling_level=cfg.is_level, epsilon=cfg.clip_eps,
        **({"loss_type": "cispo", "epsilon_high": 1.0 + cfg.clip_eps_high} if cfg.clip == "cispo"
           else {"loss_type": LOSS_TYPES[cfg.loss_agg], "epsilon_high": cfg.clip_eps_high}),
        mask_truncated_completions=cfg.overlong_filter,
        # sampling: plain temperature sampling, as rollout.generate
        max_completion_length=cfg.max_new_tokens, temperature=cfg.temperature, top_p=1.0, top_k=0,
        use_vllm=False, seed=cfg.seed, data_seed=cfg.seed,
        # numerics and plumbing: fp32 like our loop, no checkpointing, nothing written; reported
        # to TensorBoard only when asked (tblog)
        bf16=False, fp16=False, use_cpu=(device == "cpu"),
        report_to=tblog.resolve_report_to(cfg.report_to), save_strategy="no", logging_steps=1,
        disable_tqdm=True,
        dataloader_num_workers=0, dataloader_pin_memory=False, remove_unused_columns=False,
        log_completions=False,
    )
    # transformers 5.23 names it activation_checkpointing, 5.17 (the lent GPU machine's, found by
    # its first make gpu-check) gradient_checkpointing only: whichever this version has
    names = {f.name for f in fields(TRLGRPOConfig)}
    flag = next(n for n in ("activation_checkpointing", "gradient_checkpointing") if n in names)
    kwargs[flag] = False
    kwargs.update(overrides)
    return TRLGRPOConfig(**kwargs)


def from_trl_config(args, eval_every: int = GRPOConfig.eval_every,
                    max_turns: int = GRPOConfig.max_turns) -> GRPOConfig:
    """Our ``GRPOConfig`` from a ``trl.GRPOConfig`` built by ``to_trl_config`` (the inverse map)."""
    if args.gradient_accumulation_steps != 1 or args.steps_per_generation != 1:
        raise ValueError("only one optimizer step per generation round maps to our loop")
    if args.per_device_train_batch_size % args.num_generations:
        raise ValueError("per_device_train_batch_size must be a multiple of num_generations")
    estimator = {v: k for k, v in SCALE_REWARDS.items()}[args.scale_rewards]
    cispo = args.loss_type == "cispo"
    loss_agg = "token_mean" if cispo else {v: k for k, v in LOSS_TYPES.items()}[args.loss_type]
    return GRPOConfig(
        estimator=estimator, loss_agg=loss_agg, clip_eps=args.epsilon,
        clip_eps_high=args.epsilon_high - 1.0 if cispo else args.epsilon_high, beta=args.beta,
        is_level=args.importance_sampling_level, clip="cispo" if cispo else "ppo",
        num_prompts=args.per_device_train_batch_size // args.num_generations,
        group_size=args.num_generations, num_iters=args.max_steps,
        num_epochs=args.num_iterations, lr=args.learning_rate,
        max_new_tokens=args.max_completion_length, temperature=args.temperature,
        max_grad_norm=args.max_grad_norm, seed=args.seed,
        overlong_filter=args.mask_truncated_completions, eval_every=eval_every,
        max_turns=max_turns, report_to="tensorboard" if "tensorboard" in args.report_to else None,
        **TRL_FIXED)


def to_dataset(problems: list[dict], conversational: bool = True):
    """A ``datasets.Dataset`` for GRPOTrainer: "prompt" as a one-message conversation (TRL applies
    the tokenizer's chat template, as ``rollout.format_prompts`` does) and every other key of the
    problems as a column, which TRL hands to the reward functions as keyword lists."""
    from datasets import Dataset

    rows = []
    for p in problems:
        row = dict(p)
        conv = [{"role": "user", "content": p["prompt"]}]
        row["prompt"] = conv if conversational else p["prompt"]
        rows.append(row)
    return Dataset.from_list(rows)


class HeldOutEval(TrainerCallback):
    """Calls ``evaluate(model) -> dict`` (the callback ``grpo.train`` takes) before training
    (step 0), every ``every`` optimizer steps and at the last step: the steps ``loop.run``
    evaluates at. ``rows`` holds {"iter", "eval/<key>"..., "time/eval_s", "time/train_s"};
    train_s is wall time since training began minus the time spent in these evaluations."""

    def __init__(self, evaluate, every: int):
        self.evaluate, self.every = evaluate, every
        self.rows: list[dict] = []
        self._t0 = None
        self._eval_total = 0.0

    def _record(self, step: int, model) -> None:
        t = time.perf_counter()
        metrics = self.evaluate(model)
        dt = time.perf_counter() - t
        train_s = t - self._t0 - self._eval_total
        self._eval_total += dt
        self.rows.append({"iter": step, **{f"eval/{k}": v for k, v in metrics.items()},
                          "time/eval_s": dt, "time/train_s": train_s})

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._t0 = time.perf_counter()
        self._record(0, model)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        s = state.global_step
        if s % self.every == 0 or s == state.max_steps:
            self._record(s, model)
            model.train()  # the evaluation put the model in eval mode


def trl_cfg_fields_covered() -> set[str]:
    """Every field of our GRPOConfig is mapped, fixed by TRL, or loop-only (a test checks this)."""
    names = {f.name for f in fields(GRPOConfig)}
    return names & (set(MAPPED) | set(TRL_FIXED) | set(LOOP_ONLY))


def _device_of(model, device: str | None) -> str:
    """The device TRL is told to use: the model's unless one is given (TRL's ``use_cpu``)."""
    return device if device is not None else model_device(model).type


def make_trainer(model, tokenizer, train_problems: list[dict], reward_funcs: list, cfg: GRPOConfig,
                 output_dir: str, device: str | None = None, callbacks=None, **overrides):
    """A ``trl.GRPOTrainer`` over the same model object, tokenizer, data and rewards as our loop,
    on the model's device unless ``device`` says otherwise."""
    from transformers import PrinterCallback
    from trl import GRPOTrainer

    if cfg.beta != 0.0 and not getattr(model.config, "_name_or_path", ""):
        raise ValueError("with beta != 0 TRL reloads the reference model from "
                         "model.config._name_or_path; load the policy from a checkpoint folder "
                         "(load_policy(path)) or save it first")
    args = to_trl_config(cfg, output_dir, device=_device_of(model, device), **overrides)
    trainer = GRPOTrainer(model=model, reward_funcs=list(reward_funcs), args=args,
                          train_dataset=to_dataset(train_problems), processing_class=tokenizer,
                          callbacks=list(callbacks or []))
    trainer.remove_callback(PrinterCallback)  # the logs stay in trainer.state.log_history
    return trainer


# --- multi-turn: the environment trainer -----------------------------------------------------------
def tool_tokenizer(tokenizer):
    """A copy of ``tokenizer`` with TRL's bundled Qwen2.5 tool-calling chat template (offline)."""
    from trl.chat_template_utils import qwen2_5_chat_template, supports_tool_calling

    tok = copy.deepcopy(tokenizer)
    tok.chat_template = qwen2_5_chat_template
    if not supports_tool_calling(tok):
        raise ValueError("the Qwen2.5 template does not render tool calls with this tokenizer")
    return tok


def to_env_dataset(seeds: list[int], instruction: str = INSTRUCTION):
    """One row per task seed: a one-message conversation and the ``seed`` column (given to reset)."""
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": instruction}], "seed": int(s)}
                              for s in seeds])


def tool_sft(model, tokenizer, make_env, seeds: list[int], epsilon: float = 0.3, steps: int = 60,
             batch_size: int = 8, lr: float = 3e-3, max_turns: int = 4, seed: int = 0,
             instruction: str = INSTRUCTION) -> list[float]:
    """Teach the tiny LM the tool-call format: ``sft.fit`` (constant lr, no weight decay) on the
    assistant turns of a noisy scripted policy's conversations rendered with ``tokenizer``'s (tool)
    template and the move tool's schema (``rollout.messages_example``). Trains ``model`` in place;
    returns the loss of every step."""
    import numpy as np

    rng = np.random.default_rng(seed)
    eps = play_episodes(make_env, scripted_policy(epsilon, rng), seeds, 1, max_turns)
    tools = [GridToolEnv(make_env()).move]
    examples = [messages_example(tokenizer, tool_conversation(make_env(), s, ep.actions, instruction),
                                 tools) for s, ep in zip(seeds, eps)]
    order = np.random.default_rng(seed + 1)
    history = fit(model, lambda _: [examples[j] for j in order.choice(len(examples), batch_size,
                                                                       replace=False)],
                  lambda b: masked_nll(model, b, tokenizer.pad_token_id), steps, lr,
                  weight_decay=0.0, schedule="constant", log_every=1)
    return [loss for _, loss in history]


def make_env_trainer(model, tokenizer, make_env, train_seeds: list[int], cfg: GRPOConfig,
                     output_dir: str, max_completion_length: int = 512, device: str | None = None,
                     callbacks=None, instruction: str = INSTRUCTION, wrapper=None, **overrides):
    """A ``trl.GRPOTrainer`` on the multi-turn environment: our ``GRPOConfig`` mapped by
    ``to_trl_config`` (one optimizer step per round of ``num_prompts x group_size`` rollouts),
    ``max_tool_calling_iterations = cfg.max_turns - 1`` (the first move comes with the first
    generation), and ``max_completion_length`` for the whole exchange. ``tokenizer`` must carry a
    tool-calling template (``tool_tokenizer``). On the model's device unless ``device`` says
    otherwise. ``wrapper``: the tool object around each environment (``tool_env.GridToolEnv``, the
    default, or ``tool_env.KGToolEnv``). Returns the trainer."""
    from transformers import PrinterCallback
    from trl import GRPOTrainer

    kw = dict(max_tool_calling_iterations=max(cfg.max_turns - 1, 0),
              max_completion_length=max_completion_length)
    kw.update(overrides)
    args = to_trl_config(cfg, output_dir, device=_device_of(model, device), **kw)
    trainer = GRPOTrainer(model=model, reward_funcs=None, args=args,
                          train_dataset=to_env_dataset(train_seeds, instruction),
                          processing_class=tokenizer,
                          environment_factory=environment_factory(make_env, wrapper or GridToolEnv),
                          callbacks=list(callbacks or []))
    trainer.remove_callback(PrinterCallback)
    return trainer
