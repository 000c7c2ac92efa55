"""Run our GRPO configuration through TRL's ``GRPOTrainer``: the config mapping, the data set, and a
callback that evaluates a held-out panel at fixed steps.

``to_trl_config(cfg)`` builds a ``trl.GRPOConfig`` that makes TRL (1.16) do what ``grpo.train`` does
with ``cfg``: one generation round of ``num_prompts x group_size`` completions per optimizer step,
the same advantage (``scale_rewards``), the same aggregation (``loss_type``), clip range, KL weight,
learning rate (constant, no warm-up, AdamW without weight decay, as our loop), gradient clipping,
sampling temperature and completion length. ``from_trl_config`` inverts it, so a round trip
returns the same ``GRPOConfig``.

What TRL does not have raises ``ValueError`` naming the field (see ``TRL_FIXED`` and
``UNSUPPORTED_ADVANTAGES``); nothing is silently dropped:
- std with ddof=1 and the k3 KL estimator are the only choices TRL implements;
- dynamic sampling and DAPO's soft overlong punishment are not GRPOTrainer options;
- the 'reinforce', 'reinforce_baseline' and 'rloo' advantages belong to other trainers;
- ``overlong_filter`` maps to ``mask_truncated_completions`` only with ``loss_agg='token_mean'``:
  TRL zeroes the mask of a truncated row but keeps the row in the batch, so 'seq_mean' and
  'const_norm' would divide by a different count than our loop, which drops the row.

Aggregation names: ``seq_mean`` = TRL "grpo", ``token_mean`` = "bnpo" (equal to "dapo" with one
process and no gradient accumulation), ``const_norm`` = "dr_grpo" (checked in tests/test_grpo.py).
"""

from __future__ import annotations

import time
from dataclasses import fields

from transformers import TrainerCallback

from agentrl_lib.algorithms.grpo import GRPOConfig

LOSS_TYPES = {"seq_mean": "grpo", "token_mean": "bnpo", "const_norm": "dr_grpo"}
SCALE_REWARDS = {"grpo": "group", "dr_grpo": "none", "lite_ppo": "batch"}
UNSUPPORTED_ADVANTAGES = ("reinforce", "reinforce_baseline", "rloo")
# Our fields whose value TRL's GRPOTrainer fixes: a config must hold exactly this value.
TRL_FIXED = {"std_ddof": 1, "kl_estimator": "k3", "dynamic_sampling": False, "overlong_buffer": 0,
             "overlong_penalty": 1.0}
# Our fields with a TRL counterpart (ours -> TRL's GRPOConfig / TrainingArguments).
MAPPED = {"advantage": "scale_rewards", "loss_agg": "loss_type", "clip_eps": "epsilon",
          "clip_eps_high": "epsilon_high", "beta": "beta",
          "num_prompts": "per_device_train_batch_size",
          "group_size": "num_generations", "num_iters": "max_steps",
          "num_inner_epochs": "num_iterations", "lr": "learning_rate",
          "max_new_tokens": "max_completion_length", "temperature": "temperature",
          "max_grad_norm": "max_grad_norm", "seed": "seed",
          "overlong_filter": "mask_truncated_completions"}
# Fields of the loop around the update, not of the update: the eval callback takes them.
LOOP_ONLY = ("eval_every",)


def check_supported(cfg: GRPOConfig) -> None:
    """Raise ValueError for any setting TRL's GRPOTrainer cannot reproduce."""
    for name, value in TRL_FIXED.items():
        if getattr(cfg, name) != value:
            raise ValueError(f"TRL's GRPOTrainer has no {name}={getattr(cfg, name)!r}; "
                             f"it implements only {name}={value!r}")
    if cfg.advantage in UNSUPPORTED_ADVANTAGES:
        raise ValueError(f"advantage {cfg.advantage!r} is not a GRPOTrainer option; it supports "
                         f"{sorted(SCALE_REWARDS)} (scale_rewards group/none/batch)")
    if cfg.overlong_filter and cfg.loss_agg != "token_mean":
        raise ValueError("overlong_filter maps to TRL's mask_truncated_completions only with "
                         "loss_agg='token_mean' (TRL keeps masked rows in the per-sequence mean)")


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
        num_iterations=cfg.num_inner_epochs,
        per_device_train_batch_size=cfg.num_prompts * cfg.group_size, gradient_accumulation_steps=1,
        steps_per_generation=1, num_generations=cfg.group_size,
        loss_type=LOSS_TYPES[cfg.loss_agg], scale_rewards=SCALE_REWARDS[cfg.advantage],
        epsilon=cfg.clip_eps, epsilon_high=cfg.clip_eps_high, beta=cfg.beta,
        mask_truncated_completions=cfg.overlong_filter,
        # sampling: plain temperature sampling, as rollout.generate
        max_completion_length=cfg.max_new_tokens, temperature=cfg.temperature, top_p=1.0, top_k=0,
        use_vllm=False, seed=cfg.seed, data_seed=cfg.seed,
        # numerics and plumbing: fp32 like our loop, no checkpointing, nothing written or reported
        bf16=False, fp16=False, activation_checkpointing=False, use_cpu=(device == "cpu"),
        report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True,
        dataloader_num_workers=0, dataloader_pin_memory=False, remove_unused_columns=False,
        log_completions=False,
    )
    kwargs.update(overrides)
    return TRLGRPOConfig(**kwargs)


def from_trl_config(args, eval_every: int = GRPOConfig.eval_every) -> GRPOConfig:
    """Our ``GRPOConfig`` from a ``trl.GRPOConfig`` built by ``to_trl_config`` (the inverse map)."""
    if args.gradient_accumulation_steps != 1 or args.steps_per_generation != 1:
        raise ValueError("only one optimizer step per generation round maps to our loop")
    if args.per_device_train_batch_size % args.num_generations:
        raise ValueError("per_device_train_batch_size must be a multiple of num_generations")
    advantage = {v: k for k, v in SCALE_REWARDS.items()}[args.scale_rewards]
    loss_agg = {v: k for k, v in LOSS_TYPES.items()}[args.loss_type]
    return GRPOConfig(
        advantage=advantage, loss_agg=loss_agg, clip_eps=args.epsilon,
        clip_eps_high=args.epsilon_high, beta=args.beta,
        num_prompts=args.per_device_train_batch_size // args.num_generations,
        group_size=args.num_generations, num_iters=args.max_steps,
        num_inner_epochs=args.num_iterations, lr=args.learning_rate,
        max_new_tokens=args.max_completion_length, temperature=args.temperature,
        max_grad_norm=args.max_grad_norm, seed=args.seed,
        overlong_filter=args.mask_truncated_completions, eval_every=eval_every, **TRL_FIXED)


def to_dataset(problems: list[dict], conversational: bool = True):
    """A ``datasets.Dataset`` for GRPOTrainer: "prompt" as a one-message conversation (TRL applies
    the tokenizer's chat template, as ``grpo.format_prompts`` does) and every other key of the
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
    """Evaluates ``eval_fn(model) -> float`` before training (step 0), every ``every`` optimizer
    steps and at the last step, the same step numbers as ``grpo.train``. ``rows`` holds
    {"step", "eval_acc", "eval_s", "train_s"}; train_s is wall time since training began minus the
    time spent in these evaluations."""

    def __init__(self, eval_fn, every: int):
        self.eval_fn, self.every = eval_fn, every
        self.rows: list[dict] = []
        self._t0 = None
        self._eval_total = 0.0

    def _record(self, step: int, model) -> None:
        t = time.perf_counter()
        acc = float(self.eval_fn(model))
        dt = time.perf_counter() - t
        train_s = t - self._t0 - self._eval_total
        self._eval_total += dt
        self.rows.append({"step": step, "eval_acc": acc, "eval_s": dt, "train_s": train_s})

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


def make_trainer(model, tokenizer, train_problems: list[dict], reward_funcs: list, cfg: GRPOConfig,
                 output_dir: str, device: str = "cpu", callbacks=None, **overrides):
    """A ``trl.GRPOTrainer`` over the same model object, tokenizer, data and rewards as our loop."""
    from transformers import PrinterCallback
    from trl import GRPOTrainer

    if cfg.beta != 0.0 and not getattr(model.config, "_name_or_path", ""):
        raise ValueError("with beta != 0 TRL reloads the reference model from "
                         "model.config._name_or_path; load the policy from a checkpoint folder "
                         "(load_policy(path)) or save it first")
    args = to_trl_config(cfg, output_dir, device=device, **overrides)
    trainer = GRPOTrainer(model=model, reward_funcs=list(reward_funcs), args=args,
                          train_dataset=to_dataset(train_problems), processing_class=tokenizer,
                          callbacks=list(callbacks or []))
    trainer.remove_callback(PrinterCallback)  # the logs stay in trainer.state.log_history
    return trainer
