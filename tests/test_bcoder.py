"""B-Coder's pieces by hand (agentrl_lib.algorithms.bcoder): the dueling Q on LM logits, token-level
Bellman targets with a terminal test reward, the CQL penalty (and its alpha = 1 identity with the
NLL), one update on a tiny LM, Q-reranking; and SFTConfig(completions='human'), the program base's
data."""

import copy

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


def test_bellman_targets_by_hand():
    next_max = torch.tensor([[0.5, 0.7, 0.9, 0.2], [0.3, 0.6, 0.8, 0.1]])
    mask = torch.tensor([[1., 1., 1., 0.], [1., 1., 1., 1.]])
    y = bcoder.bellman_targets(next_max, torch.tensor([1., 0.]), mask, gamma=0.9)
    want = torch.tensor([[0.45, 0.63, 1.0, 0.0], [0.27, 0.54, 0.72, 0.0]])
    assert torch.allclose(y, want)
    # a one-token program: the target is its reward alone
    one = bcoder.bellman_targets(torch.tensor([[0.5, 0.5]]), torch.tensor([1.]), torch.tensor([[1., 0.]]), 1.0)
    assert one.tolist() == [[1.0, 0.0]]


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


def test_loss_is_td_plus_weighted_penalty():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 3, 4, generator=g)
    nm, a = torch.rand(2, 3, generator=g), torch.randint(4, (2, 3), generator=g)
    r, mask = torch.tensor([1., 0.]), torch.tensor([[1., 1., 1.], [1., 0., 0.]])
    l0, m0 = bcoder.bcoder_loss(q, nm, a, r, mask, bcoder.BCoderConfig(cql_alpha=0.0))
    l2, m2 = bcoder.bcoder_loss(q, nm, a, r, mask, bcoder.BCoderConfig(cql_alpha=2.0))
    assert l0.item() == pytest.approx(m0["losses/td"])
    assert l2.item() == pytest.approx(m2["losses/td"] + 2 * m2["losses/cql"], abs=1e-6)


def test_update_changes_q_towards_targets_and_rerank():
    lm, tok = new_model("tiny-64", seed=0)
    qnet = bcoder.QNet(lm, alpha=1.0, v_init=0.5)
    ex = [chat_example(tok, "f(0)=1", "inc"), chat_example(tok, "f(0)=1", "dec")]
    r = torch.tensor([1.0, 0.0])
    target = copy.deepcopy(qnet)
    opt = torch.optim.AdamW(qnet.parameters(), lr=1e-2)
    before = [p.detach().clone() for p in qnet.parameters()]
    cfg = bcoder.BCoderConfig(cql_alpha=0.0)
    first = bcoder.update(qnet, target, opt, ex, r, cfg, tok.pad_token_id)
    assert any(not torch.equal(b, p) for b, p in zip(before, qnet.parameters()))
    for _ in range(30):
        m = bcoder.update(qnet, target, opt, ex, r, cfg, tok.pad_token_id)
    assert m["losses/td"] < first["losses/td"]
    # rerank: the last action's Q of 'inc' (right) ends above that of 'dec' (wrong)
    from agentrl_lib.rollout import encode_prompts, format_prompts, pad_examples
    p_ids, p_mask = encode_prompts(tok, format_prompts(tok, [{"prompt": "f(0)=1"}] * 2), "cpu")
    c = [tok("inc")["input_ids"] + [tok.eos_token_id], tok("dec")["input_ids"] + [tok.eos_token_id]]
    c_ids, _, c_mask = pad_examples([(x, [1] * len(x)) for x in c], tok.pad_token_id, "cpu")
    s = bcoder.rerank_scores(qnet, p_ids, p_mask, c_ids, c_mask.long())
    assert s[0] > s[1]
    assert bcoder.pick_best(torch.tensor([0.1, 0.9, 0.3, 0.5, 0.5, 0.2]), 3).tolist() == [1, 3]
    with pytest.raises(ValueError, match="reduce"):
        bcoder.rerank_scores(qnet, p_ids, p_mask, c_ids, c_mask.long(), reduce="mean")


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
