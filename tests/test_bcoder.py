"""B-Coder's pieces by hand (agentrl_lib.algorithms.bcoder): eq. 2's four-level reward, eq. 16's
dueling Q on LM logits, the conservative operator of eq. 14-15 (bootstrap on the pre-trained LM's
greedy token) against B*'s max, token-level Bellman targets, eq. 17's loss (L_Q + L_adv + L_ce on
the ground-truth programs), the CQL variant (and its alpha = 1 identity with the NLL), one update
on a tiny LM, the paper's rerank score (eq. 19-20); and SFTConfig(completions='human'), the
program base's data."""

import copy
import math

import pytest
import torch

from agentrl_lib.algorithms import bcoder
from agentrl_lib.algorithms.sft import SFTConfig, task_examples
from agentrl_lib.envs.program_synth import ProgramSynthTask
from agentrl_lib.envs.text_tasks import make_problems
from agentrl_lib.models.tiny_lm import new_model
from agentrl_lib.rollout import chat_example


def test_dueling_q_by_hand():
    logits = torch.tensor([[1.0, 3.0, 2.0]])
    q = bcoder.dueling_q(logits, torch.tensor([0.4]), alpha=0.5)
    # 0.4 + 0.5 * (l - 3)
    assert torch.allclose(q, torch.tensor([[-0.6, 0.4, -0.1]]))
    assert q.max(-1).values.item() == pytest.approx(0.4)  # max_a Q = V


def test_four_level_reward_on_real_programs():
    judge = ProgramSynthTask(2, 2)
    t = judge.task(0)
    cases = {t["reference"]: 1.0, "5": -0.3, "drop add": -0.6, "inc foo": -1.0}
    for prog, want in cases.items():
        res = judge.evaluate(prog, t["tests"], sandbox=False)
        assert bcoder.unit_test_reward(prog, res) == want, (prog, res)
    # the sandbox stopping a runaway program is a program that cannot be executed
    assert bcoder.unit_test_reward("9 rep inc", {"pass_rate": 0.0, "reason": "timeout"}) == -0.6
    assert sorted(bcoder.REWARD_LEVELS.values()) == [-1.0, -0.6, -0.3, 1.0]


def test_conservative_operator_target_by_hand():
    # one program of 3 tokens, vocabulary 3: Q(s_{t+1}, .) and p_ckpt's logits after each token
    q_next = torch.tensor([[[0.2, 0.7, 0.1], [0.5, 0.3, 0.9], [1.0, 1.0, 1.0]]])  # (1, 3, 3)
    base = torch.tensor([[[2.0, 0.0, 1.0], [0.0, 3.0, 1.0], [0.0, 0.0, 0.0]]])
    r, mask = torch.tensor([-0.3]), torch.ones(1, 3)
    cons = bcoder.bootstrap_values(q_next, "conservative", base)  # p_ckpt's greedy: 0, then 1
    assert torch.allclose(cons[:, :2], torch.tensor([[0.2, 0.3]]))
    y_cons = bcoder.bellman_targets(cons, r, mask, gamma=0.9)
    assert torch.allclose(y_cons, torch.tensor([[0.18, 0.27, -0.3]]))
    y_max = bcoder.bellman_targets(bcoder.bootstrap_values(q_next, "max"), r, mask, gamma=0.9)
    assert torch.allclose(y_max, torch.tensor([[0.63, 0.81, -0.3]]))  # B*: 0.9 * 0.7, 0.9 * 0.9
    assert torch.equal(bcoder.bootstrap_values(q_next, "cql"),
                       bcoder.bootstrap_values(q_next, "max"))
    with pytest.raises(ValueError, match="pre-trained"):
        bcoder.bootstrap_values(q_next, "conservative")
    with pytest.raises(ValueError, match="operator"):
        bcoder.bootstrap_values(q_next, "soft")


def test_bellman_targets_by_hand():
    next_max = torch.tensor([[0.5, 0.7, 0.9, 0.2], [0.3, 0.6, 0.8, 0.1]])
    mask = torch.tensor([[1., 1., 1., 0.], [1., 1., 1., 1.]])
    y = bcoder.bellman_targets(next_max, torch.tensor([1., 0.]), mask, gamma=0.9)
    want = torch.tensor([[0.45, 0.63, 1.0, 0.0], [0.27, 0.54, 0.72, 0.0]])
    assert torch.allclose(y, want)
    # a one-token program: the target is its reward alone
    one = bcoder.bellman_targets(torch.tensor([[0.5, 0.5]]), torch.tensor([1.]),
                                 torch.tensor([[1., 0.]]), 1.0)
    assert one.tolist() == [[1.0, 0.0]]


def test_imitation_losses_by_hand():
    # row 0 a ground-truth program (tokens 1 then 0), row 1 not (excluded)
    q = torch.tensor([[[1.0, 0.0], [0.5, 0.5]], [[0.0, 4.0], [2.0, -1.0]]])  # (2, 2, 2)
    a, mask = torch.tensor([[1, 0], [0, 1]]), torch.ones(2, 2)
    l_adv, l_ce = bcoder.imitation_losses(q, a, mask, torch.tensor([1., 0.]), alpha=1.0)
    assert l_adv.item() == pytest.approx(1.0)  # |0 - 1| + |0.5 - 0.5|
    assert l_ce.item() == pytest.approx(math.log(1 + math.e) + math.log(2), abs=1e-6)
    none = bcoder.imitation_losses(q, a, mask, torch.zeros(2), alpha=1.0)
    assert [x.item() for x in none] == [0.0, 0.0]  # no ground truth in the batch


def test_cql_penalty_by_hand_and_alpha1_identity():
    q = torch.tensor([[[0.0, 0.0], [1.0, 0.0]]])  # (1, 2, 2)
    qd = torch.tensor([[0.0, 0.0]])  # took action 0 then action 1
    pen, _ = bcoder.cql_penalty(q, qd, torch.ones(1, 2))
    want = (torch.log(torch.tensor(2.0)) + (torch.log(torch.tensor(1 + torch.e)) - 0.0)) / 2
    assert pen.item() == pytest.approx(want.item(), abs=1e-6)
    g = torch.Generator().manual_seed(0)
    logits, v = torch.randn(3, 4, 5, generator=g), torch.rand(3, 4, generator=g)
    a = torch.randint(5, (3, 4), generator=g)
    q1 = bcoder.dueling_q(logits, v, 1.0)
    pen1, _ = bcoder.cql_penalty(q1, q1.gather(-1, a[..., None]).squeeze(-1), torch.ones(3, 4))
    nll = -torch.log_softmax(logits, -1).gather(-1, a[..., None]).mean()
    assert pen1.item() == pytest.approx(nll.item(), abs=1e-5)


def test_loss_is_eq17_plus_the_cql_variant():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 3, 4, generator=g)
    nq, a = torch.rand(2, 3, generator=g), torch.randint(4, (2, 3), generator=g)
    r, mask = torch.tensor([1., -0.3]), torch.tensor([[1., 1., 1.], [1., 0., 0.]])
    lc, mc = bcoder.bcoder_loss(q, nq, a, r, mask, bcoder.BCoderConfig())
    assert lc.item() == pytest.approx(mc["losses/td"] + 0.1 * mc["losses/adv"]
                                      + 0.5 * mc["losses/ce"], abs=1e-6)
    l_adv, l_ce = bcoder.imitation_losses(q, a, mask, torch.tensor([1., 0.]), 1.0)
    assert mc["losses/adv"] == pytest.approx(l_adv.item()) and "losses/cql" not in mc
    cfg2 = bcoder.BCoderConfig(operator="cql", cql_alpha=2.0)
    l2, m2 = bcoder.bcoder_loss(q, nq, a, r, mask, cfg2)
    assert l2.item() == pytest.approx(lc.item() + 2 * m2["losses/cql"], abs=1e-6)


class FixedQ(torch.nn.Module):
    """A stand-in Q-net returning fixed Q-values (1, L, V), whatever the input."""

    def __init__(self, q):
        super().__init__()
        self.q = q

    def forward(self, ids, attn, pos):
        return self.q.expand(ids.shape[0], -1, -1), self.q.max(-1).values


def test_rerank_scores_by_hand():
    # prompt of 1 token; Q(s_t, .) over 2 tokens at s_0, s_1, s_2 and after the last token
    q = torch.tensor([[[0.5, 0.2], [0.1, 0.4], [0.3, 0.6], [9.0, 9.0]]])  # (1, 4, 2)
    p_ids, p_mask = torch.zeros(2, 1, dtype=torch.long), torch.ones(2, 1, dtype=torch.long)
    c_ids, c_mask = torch.tensor([[0, 1, 0], [1, 0, 0]]), torch.tensor([[1, 1, 1], [1, 1, 0]])

    def score(reduce, gamma=1.0):
        return bcoder.rerank_scores(FixedQ(q), p_ids, p_mask, c_ids, c_mask, reduce, gamma).tolist()

    # row 0: (0.5 - 0.4) + (0.4 - 0.6) + (0.3 - 0) = sum_t A + V(s_0) = -0.3 + 0.5;
    # row 1: (0.2 - 0.4) + (0.1 - 0), its last token's next state terminal
    assert score("paper") == pytest.approx([0.2, -0.1])
    assert score("paper", gamma=0.5) == pytest.approx([0.3 + 0.1 + 0.3, 0.0 + 0.1])
    assert score("min") == pytest.approx([0.3, 0.1])
    assert score("last") == pytest.approx([0.3, 0.1])
    assert bcoder.pick_best(torch.tensor([0.1, 0.9, 0.3, 0.5, 0.5, 0.2]), 3).tolist() == [1, 3]
    with pytest.raises(ValueError, match="reduce"):
        score("mean")


def test_update_moves_q_towards_targets_and_reranks():
    lm, tok = new_model("tiny-64", seed=0)
    base = copy.deepcopy(lm).eval()
    qnet = bcoder.QNet(lm, alpha=1.0, v_init=0.5)
    ex = [chat_example(tok, "f(0)=1", "inc"), chat_example(tok, "f(0)=1", "dec")]
    r = torch.tensor([1.0, -0.3])
    opt = torch.optim.AdamW(qnet.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in qnet.parameters()]
    cfg = bcoder.BCoderConfig()
    with pytest.raises(ValueError, match="pre-trained"):
        bcoder.update(qnet, None, opt, ex, r, cfg, tok.pad_token_id)
    first = bcoder.update(qnet, None, opt, ex, r, cfg, tok.pad_token_id, base)
    assert any(not torch.equal(b, p) for b, p in zip(before, qnet.parameters()))
    # 10 updates: longer, the LM leaves this random base's greedy tokens and the TD error rises
    for _ in range(10):
        m = bcoder.update(qnet, None, opt, ex, r, cfg, tok.pad_token_id, base)
    assert m["losses/td"] < first["losses/td"] and m["losses/ce"] < first["losses/ce"]
    # rerank by the paper's score: 'inc' (right) above 'dec' (wrong)
    from agentrl_lib.rollout import encode_prompts, format_prompts, pad_examples
    p_ids, p_mask = encode_prompts(tok, format_prompts(tok, [{"prompt": "f(0)=1"}] * 2), "cpu")
    c = [tok("inc")["input_ids"] + [tok.eos_token_id], tok("dec")["input_ids"] + [tok.eos_token_id]]
    c_ids, _, c_mask = pad_examples([(x, [1] * len(x)) for x in c], tok.pad_token_id, "cpu")
    s = bcoder.rerank_scores(qnet, p_ids, p_mask, c_ids, c_mask.long())
    assert s[0] > s[1]


def test_operators_agree_at_the_start():
    # theta = theta_ckpt: the online LM's greedy token is p_ckpt's, so B^q's target is B*'s
    lm, tok = new_model("tiny-64", seed=0)
    qnet = bcoder.QNet(copy.deepcopy(lm), alpha=1.0, v_init=0.5)
    ids, attn, pos, _ = bcoder.program_batch([chat_example(tok, "f(1)=3", "inc inc")],
                                             tok.pad_token_id, "cpu")
    with torch.no_grad():
        q_next = qnet(ids, attn, pos)[0][:, 1:]
        base_next = lm(input_ids=ids, attention_mask=attn, position_ids=pos).logits[:, 1:]
    assert torch.allclose(bcoder.bootstrap_values(q_next, "conservative", base_next),
                          bcoder.bootstrap_values(q_next, "max"))


def test_sft_config_human_completions():
    _, tok = new_model("tiny-64", seed=0)
    cfg = SFTConfig(task="program", difficulties=(2,), num_problems=3, completions="human")
    ex = task_examples(cfg, tok)
    problems = make_problems("program", 3, 2, "train", seed=0, strict=False)
    want = [chat_example(tok, p["prompt"], prog) for p in problems
            for prog, _ in ProgramSynthTask(2, 2).human_programs(p["seed"])]
    assert ex == want and len(ex) > len(problems)  # every human program, right and buggy
    with pytest.raises(ValueError, match="completions must be 'reference' or 'human'"):
        task_examples(SFTConfig(task="program", completions="people"), tok)
    with pytest.raises(ValueError, match="program task"):
        task_examples(SFTConfig(task="arithmetic", completions="human"), tok)
