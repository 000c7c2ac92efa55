"""Bradley-Terry reward models: the loss by hand and against TRL 1.16 RewardTrainer.compute_loss, the
tabular MLE recovering utilities, the MLP, and the LM head built from a tiny-LM checkpoint; the
pointwise BCE loss (Cooper's VerifyRM) by hand, against torch's BCEWithLogitsLoss and a by-hand
AdamW loop."""

import math
from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from agentrl_lib.rewards import reward_model as rm


def test_bt_loss_hand_values():
    loss, m = rm.bt_loss(torch.tensor([2.0, 0.0]), torch.tensor([1.0, 1.0]))
    # diffs (1, -1): (log(1+e^-1) + log(1+e^1)) / 2
    assert loss.item() == pytest.approx((math.log1p(math.exp(-1)) + math.log1p(math.exp(1))) / 2)
    assert m == {"accuracy": 0.5, "margin": 0.0}
    loss, _ = rm.bt_loss(torch.tensor([2.0]), torch.tensor([1.0]), margin=torch.tensor([1.0]))
    assert loss.item() == pytest.approx(math.log(2))
    with pytest.raises(ValueError, match="differ in shape"):
        rm.bt_loss(torch.zeros(2), torch.zeros(3))


class _Accel:
    @staticmethod
    def gather(x):
        return x

    gather_for_metrics = gather


@pytest.mark.parametrize("with_margin", [False, True])
def test_equal_to_trl_reward_trainer(with_margin):
    from trl import RewardTrainer

    g = torch.Generator().manual_seed(1)
    B = 5
    r_c, r_r = torch.randn(B, generator=g), torch.randn(B, generator=g)
    margin = torch.rand(B, generator=g) if with_margin else None
    trainer = SimpleNamespace(model=SimpleNamespace(training=True), accelerator=_Accel(),
                              args=SimpleNamespace(center_rewards_coefficient=None),
                              _metrics={"train": defaultdict(list)}, _total_train_tokens=0, _tp_size=1)
    inputs = {"input_ids": torch.zeros(2 * B, 3, dtype=torch.long),
              "attention_mask": torch.ones(2 * B, 3, dtype=torch.long)}
    if with_margin:
        inputs["margin"] = margin
    stub = lambda **kw: SimpleNamespace(logits=torch.cat([r_c, r_r])[:, None])  # noqa: E731
    theirs = RewardTrainer.compute_loss(trainer, stub, inputs)
    ours, m = rm.bt_loss(r_c, r_r, margin)
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-6)
    assert m["accuracy"] == pytest.approx(trainer._metrics["train"]["accuracy"][-1])
    assert m["margin"] == pytest.approx(trainer._metrics["train"]["margin"][-1], rel=1e-6)


def test_bce_loss_hand_values():
    loss, m = rm.bce_loss(torch.tensor([0.0, 2.0]), torch.tensor([1.0, 0.0]))
    assert loss.item() == pytest.approx((math.log(2) + math.log1p(math.exp(2))) / 2, rel=1e-6)
    assert m == {"accuracy": 0.0, "positive_rate": 0.5}
    # a soft label l = 1/4 on z = 1: l log(1 + e^-1) + (1 - l) log(1 + e^1)
    loss, m = rm.bce_loss(torch.tensor([1.0]), torch.tensor([0.25]))
    assert loss.item() == pytest.approx(0.25 * math.log1p(math.exp(-1))
                                        + 0.75 * math.log1p(math.exp(1)), rel=1e-6)
    assert m["accuracy"] == 0.0  # z > 0 but l < 1/2
    loss, m = rm.bce_loss(torch.tensor([-3.0, 3.0]), torch.tensor([0.0, 1.0]))
    assert loss.item() == pytest.approx(math.log1p(math.exp(-3)), rel=1e-6)
    assert m["accuracy"] == 1.0
    with pytest.raises(ValueError, match="differ in shape"):
        rm.bce_loss(torch.zeros(2), torch.zeros(3))
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        rm.bce_loss(torch.zeros(2), torch.tensor([0.0, 2.0]))


def test_bce_loss_equals_torch_bce_with_logits_and_its_gradient_by_hand():
    """The released VerifyRM loss is ``BCEWithLogitsLoss()(logits, labels.float())``; ours equals it
    (also at |z| = 60, where a naive log(sigmoid) overflows), and for a linear model z = X w its
    gradient is mean((sigma(z) - l) x)."""
    g = torch.Generator().manual_seed(3)
    z = torch.cat([torch.randn(40, generator=g, dtype=torch.float64) * 4,
                   torch.tensor([60.0, -60.0], dtype=torch.float64)])
    lab = (torch.rand(42, generator=g) < 0.5).double()
    ours = rm.bce_loss(z, lab)[0]
    assert torch.isfinite(ours)
    assert ours.item() == pytest.approx(torch.nn.BCEWithLogitsLoss()(z, lab).item(), rel=1e-12)
    X = torch.randn(42, 3, generator=g, dtype=torch.float64)
    w = torch.randn(3, generator=g, dtype=torch.float64).requires_grad_()
    rm.bce_loss(X @ w, lab)[0].backward()
    by_hand = ((torch.sigmoid(X @ w.detach()) - lab)[:, None] * X).mean(0)
    assert torch.allclose(w.grad, by_hand, atol=1e-12)


def test_fit_bce_equals_a_by_hand_adamw_loop():
    """fit_bce = epochs of a seeded permutation in mini-batches, one AdamW step each (weight decay,
    gradient clipped at 1), on BCEWithLogitsLoss: written out here independently."""
    g = torch.Generator().manual_seed(5)
    X = torch.randn(50, 2, generator=g)
    lab = (torch.rand(50, generator=g) < torch.sigmoid(X @ torch.tensor([2.0, -1.0]) + 0.5)).float()
    torch.manual_seed(0)
    ours = torch.nn.Linear(2, 1)
    hand = torch.nn.Linear(2, 1)
    hand.load_state_dict(ours.state_dict())
    hist = rm.fit_bce(ours.parameters(), lambda i: ours(X[i]).squeeze(-1), lab, lr=0.1,
                      num_epochs=3, batch_size=16, seed=7, weight_decay=0.01)
    opt = torch.optim.AdamW(hand.parameters(), lr=0.1, weight_decay=0.01)
    gen = torch.Generator().manual_seed(7)
    losses = []
    for _ in range(3):
        order = torch.randperm(50, generator=gen)
        for s in range(0, 50, 16):
            i = order[s:s + 16]
            loss = torch.nn.BCEWithLogitsLoss()(hand(X[i]).squeeze(-1), lab[i])
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(list(hand.parameters()), 1.0)
            opt.step()
            losses.append(loss.item())
    assert len(hist) == len(losses) == 12
    assert [h["losses/bce"] for h in hist] == pytest.approx(losses, rel=1e-6)
    for a, b in zip(ours.parameters(), hand.parameters()):
        assert torch.allclose(a, b, atol=1e-6)
    assert not torch.allclose(ours.bias, torch.zeros(1))


def test_fit_bce_recovers_a_logistic_model_bias_included_where_bt_cannot():
    """Labels drawn from sigma(2 x1 - x2 + 1): the BCE fit finds the weights and the bias; a
    Bradley-Terry fit on (positive, negative) pairs of the same data cannot move the bias (its
    loss sees differences only); lr 0 leaves the model where it was."""
    g = torch.Generator().manual_seed(0)
    X = torch.randn(20000, 2, generator=g)
    true_w, true_b = torch.tensor([2.0, -1.0]), 1.0
    lab = (torch.rand(20000, generator=g) < torch.sigmoid(X @ true_w + true_b)).float()
    torch.manual_seed(1)
    model = torch.nn.Linear(2, 1)
    hist = rm.fit_bce(model.parameters(), lambda i: model(X[i]).squeeze(-1), lab, lr=0.05,
                      num_epochs=4, batch_size=256)
    assert hist[-1]["losses/bce"] < hist[0]["losses/bce"]
    assert torch.allclose(model.weight.detach()[0], true_w, atol=0.15)
    assert model.bias.item() == pytest.approx(true_b, abs=0.15)
    torch.manual_seed(1)
    bt = torch.nn.Linear(2, 1)
    b0 = bt.bias.item()
    pos, neg = X[lab == 1][:5000], X[lab == 0][:5000]
    rm.fit(bt.parameters(), lambda i: (bt(pos[i]).squeeze(-1), bt(neg[i]).squeeze(-1)), 5000,
           lr=0.05, num_epochs=2, batch_size=256)
    assert bt.bias.item() == b0
    torch.manual_seed(1)
    still = torch.nn.Linear(2, 1)
    before = [p.detach().clone() for p in still.parameters()]
    rm.fit_bce(still.parameters(), lambda i: still(X[i]).squeeze(-1), lab, lr=0.0, num_epochs=1,
               batch_size=256)
    assert all(torch.equal(a, b) for a, b in zip(before, still.parameters()))


def test_tabular_fit_recovers_centred_utilities():
    """Many sampled comparisons of Bradley-Terry utilities: the fitted scores approach them (up to a
    constant), and lr 0 leaves the scores at 0."""
    u = torch.tensor([1.0, 0.0, -1.0, 0.5])
    rng = np.random.default_rng(0)
    i = torch.tensor(rng.integers(0, 4, 4000))
    j = torch.tensor((i.numpy() + rng.integers(1, 4, 4000)) % 4)
    win = torch.tensor(rng.random(4000)) < torch.sigmoid(u[i] - u[j]).double()
    chosen, rejected = torch.where(win, i, j), torch.where(win, j, i)
    model = rm.TabularRM(4)
    hist = rm.fit(model.parameters(), rm.index_pair_rewards(model, chosen, rejected), 4000, lr=0.05,
                  num_epochs=5, batch_size=200)
    assert hist[-1]["losses/bt"] < hist[0]["losses/bt"]
    assert torch.allclose(rm.centred(model.scores.detach()), rm.centred(u), atol=0.15)
    model0 = rm.TabularRM(4)
    rm.fit(model0.parameters(), rm.index_pair_rewards(model0, chosen, rejected), 4000, lr=0.0, num_epochs=1)
    assert torch.equal(model0.scores.detach(), torch.zeros(4))


def test_mlp_on_features_ranks_unseen_responses():
    """A linear utility on features: fitted on pairs among responses 0-5, it orders 6-7 correctly."""
    feats = torch.tensor([[0.0, 1], [1, 0], [2, 1], [3, 0], [0.5, 0], [2.5, 1], [4, 1], [-1, 0]])
    u = feats @ torch.tensor([1.0, 0.0])
    pairs = [(a, b) for a in range(6) for b in range(6) if u[a] > u[b]]
    chosen, rejected = torch.tensor([p[0] for p in pairs]), torch.tensor([p[1] for p in pairs])
    model = rm.MLPRM(feats, hidden=0, seed=0)
    rm.fit(model.parameters(), rm.index_pair_rewards(model, chosen, rejected), len(pairs), lr=0.05,
           num_epochs=100, batch_size=len(pairs))
    r = model(torch.arange(8)).detach()
    assert r[6] > r[2] and r[7] < r[0]


def test_lm_reward_model_from_a_tiny_lm(tmp_path):
    from agentrl_lib.models.tiny_lm import new_model

    lm, tok = new_model("tiny-64", seed=0, tokenizer="char")  # the plain ChatML text below
    lm.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    a = rm.lm_reward_model(str(tmp_path), seed=3)
    b = rm.lm_reward_model(lm, seed=3)
    assert a.config.num_labels == 1 and type(a).__name__ == "Qwen2ForSequenceClassification"
    for (k, v), (k2, v2) in zip(a.state_dict().items(), b.state_dict().items()):
        assert k == k2 and torch.equal(v, v2), k  # same body from folder and instance, same seeded head
    assert torch.equal(a.model.embed_tokens.weight, lm.model.embed_tokens.weight)
    texts = rm.chat_texts(tok, ["1+2=", "12+30="], ["3", "42"])
    assert texts[0] == "<|im_start|>user\n1+2=<|im_end|>\n<|im_start|>assistant\n3<|im_end|>"
    together = rm.lm_rewards(a.eval(), tok, texts)  # the first is right-padded
    alone = torch.stack([rm.lm_rewards(a, tok, [x])[0] for x in texts])
    assert torch.allclose(together, alone, atol=1e-5)
    # the reward is the head at the last token: the head applied to the body's last hidden state
    ids = torch.tensor([tok(texts[1], add_special_tokens=False)["input_ids"]])
    h = a.model(input_ids=ids).last_hidden_state[0, -1]
    assert torch.allclose(a.score(h), together[1:2], atol=1e-5)
    # one fit step on the pair moves the margin up
    fit_pr = rm.lm_pair_rewards(a.train(), tok, texts[:1], texts[1:])
    before = (lambda c, r: (c - r).item())(*fit_pr(torch.tensor([0])))
    rm.fit(a.parameters(), fit_pr, 1, lr=1e-2, num_epochs=3, batch_size=1)
    assert (lambda c, r: (c - r).item())(*fit_pr(torch.tensor([0]))) > before
