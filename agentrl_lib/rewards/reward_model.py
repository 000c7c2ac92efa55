"""Bradley-Terry reward models: the pairwise loss, three models and one fitting loop.

Bradley and Terry (1952): Pr(y_w preferred to y_l) = sigma(r(y_w) - r(y_l)). A reward model r_phi is
fitted by the negative log-likelihood of observed preferences (Ouyang et al. 2022, eq. 1; TRL's
``RewardTrainer``)::

    L(phi) = -mean log sigma(r_phi(y_w) - r_phi(y_l) - m)        # m: an optional per-pair margin

The utilities are identified only up to an additive constant (the loss sees differences), so a
fitted model is compared to the truth after centring, or by its ranking.

The pointwise alternative, a classifier of single responses labelled correct (1) or incorrect (0)
(Cooper's VerifyRM, ``train_VerifyRM/train.py`` ``compute_loss``: ``BCEWithLogitsLoss`` on one
logit per (question, reference, completion)), is ``bce_loss``, fitted by ``fit_bce``::

    L(phi) = -mean [l log sigma(r_phi(y)) + (1 - l) log(1 - sigma(r_phi(y)))]

It sees each score itself, so it identifies the additive constant too (the bias), which a
Bradley-Terry fit leaves where it started.

Models (each maps a (b,) batch of pair indices to (chosen, rejected) rewards through ``fit``):
- ``TabularRM``: one free score per response (K,): the maximum-likelihood BT utilities;
- ``MLPRM``: r(y) = MLP(features(y)), a reward on features that generalises across responses;
- ``lm_reward_model``: a scalar head on the tiny LM, transformers' ``Qwen2ForSequenceClassification``
  built from a causal-LM checkpoint (the head, ``score``, is new; the body is the checkpoint's), the
  model TRL's ``RewardTrainer`` builds (``AutoModelForSequenceClassification``, ``num_labels=1``).
  The reward of a sequence is the head's output at its last non-padding token.

Nothing here imports the project's models or environments (``rewards`` sits below them); the LM
helpers take a tokenizer and format with its chat template.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from agentrl_lib.rewards.verifiable import check_columns
from agentrl_lib.utils import fit_pairs

Tensor = torch.Tensor


def bt_loss(chosen_rewards: Tensor, rejected_rewards: Tensor,
            margin: Tensor | float | None = None) -> tuple[Tensor, dict]:
    """The Bradley-Terry negative log-likelihood -mean log sigma(r_c - r_r [- margin]) of (B,)
    rewards: TRL 1.16 ``RewardTrainer.compute_loss`` without its centring term.

    Returns (scalar loss, metrics ``accuracy`` (fraction with r_c > r_r) and ``margin``
    (mean r_c - r_r)).

    >>> loss, m = bt_loss(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0]))
    >>> round(loss.item(), 4), m["accuracy"]  # (log(1 + e^-1) + log 2) / 2
    (0.5032, 0.5)
    """
    if chosen_rewards.shape != rejected_rewards.shape:
        raise ValueError(f"chosen and rejected rewards differ in shape: "
                         f"{tuple(chosen_rewards.shape)} vs {tuple(rejected_rewards.shape)}")
    diff = chosen_rewards - rejected_rewards  # (B,)
    z = diff if margin is None else diff - torch.as_tensor(margin, dtype=diff.dtype)
    loss = -F.logsigmoid(z).mean()
    with torch.no_grad():
        metrics = {"accuracy": (diff > 0).float().mean().item(), "margin": diff.mean().item()}
    return loss, metrics


def bce_loss(logits: Tensor, labels: Tensor) -> tuple[Tensor, dict]:
    """The pointwise binary cross-entropy of (B,) logits against (B,) labels in [0, 1]:
    -mean [l log sigma(z) + (1 - l) log(1 - sigma(z))], torch's ``BCEWithLogitsLoss()`` (mean
    reduction), the loss Cooper's VerifyRM is trained with.

    Returns (scalar loss, metrics ``accuracy`` (fraction with 1[z > 0] == 1[l > 1/2]) and
    ``positive_rate`` (fraction with z > 0)).

    >>> loss, m = bce_loss(torch.tensor([0.0, 2.0]), torch.tensor([1.0, 0.0]))
    >>> round(loss.item(), 4), m["accuracy"]  # (log 2 + log(1 + e^2)) / 2
    (1.41, 0.0)
    """
    if logits.shape != labels.shape:
        raise ValueError(f"logits and labels differ in shape: {tuple(logits.shape)} vs "
                         f"{tuple(labels.shape)}")
    labels = torch.as_tensor(labels, dtype=logits.dtype)
    if ((labels < 0) | (labels > 1)).any():
        raise ValueError("labels must lie in [0, 1]")
    # -l log sigma(z) - (1 - l) log sigma(-z): each term a softplus, stable at large |z|
    loss = (labels * F.softplus(-logits) + (1 - labels) * F.softplus(logits)).mean()
    with torch.no_grad():
        metrics = {"accuracy": ((logits > 0) == (labels > 0.5)).float().mean().item(),
                   "positive_rate": (logits > 0).float().mean().item()}
    return loss, metrics


# --- models ------------------------------------------------------------------------------------------
class TabularRM(nn.Module):
    """One score per response: r = scores[y], (K,) initialised at 0."""

    def __init__(self, K: int):
        super().__init__()
        self.scores = nn.Parameter(torch.zeros(K))

    def forward(self, y: Tensor) -> Tensor:  # (b,) response indices -> (b,)
        return self.scores[y]


class MLPRM(nn.Module):
    """r(y) = MLP(features[y]): features (K, d) fixed, one hidden layer (``hidden=0``: linear)."""

    def __init__(self, features: Tensor, hidden: int = 32, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.register_buffer("features", torch.as_tensor(features, dtype=torch.float32))
        d = self.features.shape[1]
        self.net = (nn.Linear(d, 1) if hidden == 0 else
                    nn.Sequential(nn.Linear(d, hidden), nn.Tanh(), nn.Linear(hidden, 1)))

    def forward(self, y: Tensor) -> Tensor:  # (b,) response indices -> (b,)
        return self.net(self.features[y]).squeeze(-1)


def lm_reward_model(source, seed: int = 0):
    """A ``Qwen2ForSequenceClassification`` (num_labels=1) whose body is a causal LM's: ``source``
    is a checkpoint folder (loaded with ``from_pretrained``, as TRL's ``RewardTrainer`` does with a
    model name) or a ``Qwen2ForCausalLM`` instance (its body weights copied). The head's weights
    are N(0, initializer_range^2) drawn from ``seed`` (no bias, as transformers). Returns the model
    in train mode, on the source's device."""
    from transformers import AutoModelForSequenceClassification, Qwen2ForSequenceClassification

    one = dict(num_labels=1, id2label={0: "LABEL_0"}, label2id={"LABEL_0": 0})
    if isinstance(source, str) or hasattr(source, "__fspath__"):
        import logging

        logging.getLogger("transformers.modeling_utils").setLevel(logging.ERROR)  # "score" is new
        rm = AutoModelForSequenceClassification.from_pretrained(str(source), **one)
    else:
        rm = Qwen2ForSequenceClassification(source.config.__class__.from_dict(
            {**source.config.to_dict(), **one}))
        rm.model.load_state_dict(source.model.state_dict(), strict=True)
        rm = rm.to(next(source.parameters()).device)
    # the head drawn from the seed alone (the body's init, if any, consumed other draws)
    g = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        w = torch.randn(rm.score.weight.shape, generator=g) * rm.config.initializer_range
        rm.score.weight.copy_(w.to(rm.score.weight.device))
    if rm.config.pad_token_id is None:
        raise ValueError("the reward model needs config.pad_token_id to find each sequence's last token")
    return rm.train()


def chat_texts(tokenizer, prompts: list[str], completions: list[str]) -> list[str]:
    """chat(prompt) + completion + end-of-turn: the text a sequence reward is computed on."""
    check_columns("chat_texts", completions=completions, prompts=prompts)
    return [tokenizer.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                          tokenize=False) + c + tokenizer.eos_token
            for p, c in zip(prompts, completions)]


def lm_rewards(rm, tokenizer, texts: list[str]) -> Tensor:
    """The head's scalar at each text's last token, (B,), with gradients (texts right-padded; the
    model pools at the last non-padding token)."""
    device = next(rm.parameters()).device
    enc = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    L = max(len(e) for e in enc)
    ids = torch.full((len(enc), L), tokenizer.pad_token_id, dtype=torch.long, device="cpu")
    attn = torch.zeros(len(enc), L, dtype=torch.long, device="cpu")
    for i, e in enumerate(enc):
        ids[i, :len(e)] = torch.tensor(e, dtype=torch.long, device="cpu")
        attn[i, :len(e)] = 1
    return rm(input_ids=ids.to(device), attention_mask=attn.to(device)).logits.squeeze(-1)  # (B,)


# --- fitting -----------------------------------------------------------------------------------------
def fit(parameters, pair_rewards, num_pairs: int, lr: float = 1e-2, num_epochs: int = 10,
        batch_size: int = 32, seed: int = 0, margin: Tensor | None = None, weight_decay: float = 0.0,
        max_grad_norm: float = 1.0, shuffle: bool = True, evaluate=None) -> list[dict]:
    """Minimise ``bt_loss`` over ``num_pairs`` pairs with AdamW at a constant ``lr``.

    pair_rewards(idx (b,) long tensor) -> (chosen rewards (b,), rejected rewards (b,)) with
    gradients; ``margin`` (N,) optional. ``evaluate()`` -> dict is logged before training and after
    every epoch. Returns one record per step: ``step``, ``epoch``, ``losses/bt``, ``accuracy``,
    ``margin`` (and ``eval/*`` at epoch ends)."""
    def pair_loss(idx: Tensor):
        r_c, r_r = pair_rewards(idx)  # (b,) each
        loss, metrics = bt_loss(r_c, r_r, None if margin is None else margin[idx])
        return loss, {"losses/bt": loss.item(), **metrics}
    return fit_pairs(parameters, pair_loss, num_pairs, lr, num_epochs, batch_size, seed,
                     weight_decay, max_grad_norm, shuffle, evaluate, desc="reward model epochs")


def fit_bce(parameters, example_logits, labels: Tensor, lr: float = 1e-2, num_epochs: int = 10,
            batch_size: int = 32, seed: int = 0, weight_decay: float = 0.0,
            max_grad_norm: float = 1.0, shuffle: bool = True, evaluate=None) -> list[dict]:
    """Minimise ``bce_loss`` over ``len(labels)`` labelled examples with AdamW at a constant
    ``lr``: the pointwise counterpart of ``fit`` (the same loop, ``utils.fit_pairs``, over
    examples instead of pairs).

    example_logits(idx (b,) long tensor) -> logits (b,) with gradients; labels (N,) in [0, 1].
    Returns one record per step: ``step``, ``epoch``, ``losses/bce``, ``accuracy``,
    ``positive_rate`` (and ``eval/*`` at epoch ends)."""
    labels = torch.as_tensor(labels)

    def example_loss(idx: Tensor):
        z = example_logits(idx)  # (b,)
        loss, metrics = bce_loss(z, labels[idx].to(z.device))
        return loss, {"losses/bce": loss.item(), **metrics}
    return fit_pairs(parameters, example_loss, len(labels), lr, num_epochs, batch_size, seed,
                     weight_decay, max_grad_norm, shuffle, evaluate, desc="reward model epochs")


def index_pair_rewards(model, chosen: Tensor, rejected: Tensor):
    """``pair_rewards`` of a model over response indices: chosen, rejected (N,) each."""
    return lambda idx: (model(chosen[idx]), model(rejected[idx]))


def lm_pair_rewards(rm, tokenizer, chosen_texts: list[str], rejected_texts: list[str]):
    """``pair_rewards`` of a sequence reward model over (chosen, rejected) texts (``chat_texts``)."""
    check_columns("lm_pair_rewards", chosen_texts=chosen_texts, rejected_texts=rejected_texts)
    def pair_rewards(idx: Tensor):
        i = idx.tolist()
        both = lm_rewards(rm, tokenizer, [chosen_texts[k] for k in i] + [rejected_texts[k] for k in i])
        return both[:len(i)], both[len(i):]
    return pair_rewards


def centred(u: Tensor) -> Tensor:
    """Utilities minus their mean: the part Bradley-Terry identifies."""
    return u - u.mean()
