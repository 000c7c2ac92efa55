"""The speed paths of issue 26 give the old numbers: the packed training forward
(``rollout.packed_sequence_logps``: length buckets, no attention mask, logits only where scored)
equals the padded one in log-probs, entropies and gradients; the compacted multi-turn KV cache
(``_Cache.compact``) samples the same tokens with the same log-probs as the cache that keeps its
padding; ``generate`` decodes in inference mode and still returns tensors a loss can use."""

import pytest
import torch

from agentrl_lib import rollout
from agentrl_lib.algorithms import grpo
from agentrl_lib.algorithms.grpo import GRPOConfig
from agentrl_lib.envs.multiturn import GridAgentEnv
from agentrl_lib.rollout import generate, lm_rollout, pad_episodes

LAYOUT = ["...", ".#.", "..."]


def make_env(max_turns=4):
    return lambda: GridAgentEnv(layout=LAYOUT, max_turns=max_turns)


def varied_caps():
    """Env caps 1..4 in creation order: rows leave the batch at different turns."""
    count = [0]

    def mk():
        count[0] += 1
        return GridAgentEnv(layout=LAYOUT, max_turns=1 + count[0] % 4)
    return mk


def both_ways(model, g, temperature=1.0, loss_mask=True):
    """(logps, entropies, gradients) of the padded and the packed pass on a Generation record."""
    out = []
    for fn in (rollout.padded_sequence_logps, rollout.packed_sequence_logps):
        model.zero_grad()
        lp, ent = fn(model, g.prompt_ids, g.prompt_mask, g.completion_ids, g.completion_mask,
                     temperature, g.loss_mask if loss_mask else None)
        (lp.sum() * 0.7 + ent.sum() * 0.3).backward()
        out.append((lp.detach(), ent.detach(), [p.grad.clone() for p in model.parameters()]))
    return out


def assert_tokens_close(got, want):
    """Per-token log-probs or entropies equal to rounding: 1e-6 absolute plus 1e-6 relative, about
    eight float32 ulps of the value (a token's log-prob near -8 differs in its last few bits when
    the packed and padded matmuls sum in another order: CI measured 2.4e-6 at -7.6 once). An
    indexing slip (a token out of line, a dropped mask) moves values by tenths or more."""
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)


def assert_grads_close(got, want):
    """Gradients equal to rounding: 1e-6 of each tensor's largest entry (sums of hundreds of
    token terms accumulated in another order)."""
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-6 * max(b.abs().max().item(), 1.0), rtol=0)


def test_length_buckets_cover_every_row_once():
    lengths = [5, 900, 7, 880, 300, 6, 310, 899]
    for overhead in (0, 50, 10**6):
        buckets = rollout.length_buckets(lengths, overhead)
        assert sorted(i for b in buckets for i in b) == list(range(len(lengths)))
        for b in buckets:  # longest first within a bucket, buckets in falling length
            assert [lengths[i] for i in b] == sorted((lengths[i] for i in b), reverse=True)
    assert rollout.length_buckets(lengths, 10**6) == [sorted(range(8), key=lambda i: -lengths[i])]
    assert len(rollout.length_buckets(lengths, 0)) == len(set(lengths))
    assert rollout.length_buckets([], 10) == []


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_packed_equals_padded_on_multiturn_episodes(tiny_lm, temperature):
    model, tok = tiny_lm  # random init: invalid actions, observations of different lengths
    eps = lm_rollout(model, tok, varied_caps(), [0, 1, 2, 3], 3, 4, 6, temperature,
                     torch.Generator().manual_seed(0))
    assert len({len(ep.token_ids) for ep in eps}) > 2
    g = pad_episodes(eps, tok.pad_token_id, "cpu")
    assert rollout._packs(model) and rollout._contiguous(g.prompt_mask, g.completion_mask)
    (lp0, ent0, gr0), (lp1, ent1, gr1) = both_ways(model, g, temperature)
    assert_tokens_close(lp1, lp0)
    assert_tokens_close(ent1, ent0)
    assert torch.equal(lp1 != 0, g.loss_mask != 0)
    assert_grads_close(gr1, gr0)
    # and both equal the sampling log-probs (the decoder's)
    torch.testing.assert_close(lp1, g.logps, atol=2e-5, rtol=0)


def test_packed_equals_padded_on_single_turn_completions(tiny_lm):
    model, tok = tiny_lm
    prompts = rollout.format_prompts(tok, [{"prompt": p} for p in ["1+2=", "12*7+30=", "x"]] * 2)
    g = generate(model, tok, prompts, 9, generator=torch.Generator().manual_seed(1))
    assert not g.logps.is_inference() and not g.completion_ids.is_inference()
    for loss_mask in (True, False):
        (lp0, ent0, gr0), (lp1, ent1, gr1) = both_ways(model, g, loss_mask=loss_mask)
        assert_tokens_close(lp1, lp0)
        assert_tokens_close(ent1, ent0)
        assert_grads_close(gr1, gr0)
    # sequence_logps takes the packed path here, the padded one for a record with holes
    lp, _ = rollout.sequence_logps(model, g.prompt_ids, g.prompt_mask, g.completion_ids,
                                   g.completion_mask)
    assert_tokens_close(lp, lp0)
    holes = g.completion_mask.clone()
    holes[0, 0] = 0
    assert not rollout._contiguous(g.prompt_mask, holes)


def test_grpo_update_is_the_same_step_either_way(tiny_lm, monkeypatch):
    """One multi-turn GRPO update (rollout, advantages, update) moves the weights the same."""
    import copy

    model, tok = tiny_lm
    cfg = GRPOConfig(num_prompts=2, group_size=3, max_turns=3, max_new_tokens=5, lr=1e-2,
                     loss_agg="token_mean", seed=0)
    batch = grpo.episode_sampler(tok, make_env(3), list(range(50)), cfg)(model, 0)
    batch = grpo.advantages(batch, cfg)
    after = []
    for fast in (False, True):
        if not fast:
            monkeypatch.setattr(rollout, "_packs", lambda m: False)
        else:
            monkeypatch.undo()
        m = copy.deepcopy(model)
        opt = torch.optim.AdamW(m.parameters(), lr=cfg.lr, weight_decay=0.0)
        out = grpo.update(m, opt, batch, cfg)
        after.append((out["losses/loss"], [p.detach().clone() for p in m.parameters()]))
    assert abs(after[0][0] - after[1][0]) < 1e-6
    for a, b in zip(after[0][1], after[1][1]):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_compacted_cache_samples_the_same_episodes(tiny_lm, monkeypatch):
    """Random init: invalid actions make observations of different lengths, so the cache holds
    padding columns that compaction removes; the sampled tokens and log-probs are the same."""
    model, tok = tiny_lm
    runs, shrunk = [], []
    original = rollout._Cache.compact

    def spy(self):
        before = self.attn.shape[1]
        original(self)
        shrunk.append(before - self.attn.shape[1])
    monkeypatch.setattr(rollout._Cache, "min_waste", 0.0)  # compact at every turn
    for compact in (False, True):
        monkeypatch.setattr(rollout._Cache, "compact", spy if compact else lambda self: None)
        runs.append(lm_rollout(model, tok, varied_caps(), [0, 1, 2, 3, 4], 3, 4, 6,
                               generator=torch.Generator().manual_seed(7)))
    a, b = runs
    assert sum(shrunk) > 0  # compaction dropped columns
    assert [e.token_ids for e in a] == [e.token_ids for e in b]
    assert [e.actions for e in a] == [e.actions for e in b]
    for x, y in zip(a, b):
        assert_tokens_close(torch.tensor(x.logps), torch.tensor(y.logps))


def test_template_frames_render_like_the_template(tiny_lm, monkeypatch):
    """``prompt_text``, ``observation_text`` and ``format_prompts`` put the content into a frame
    rendered once: the same text as rendering the template each time, for any content; a template
    that does not insert the content verbatim is rendered each time."""
    _, tok = tiny_lm
    texts = ["Turn 1/4. You are at row 2.", "", "  edge  \n", "{{ not a template }} <&>", "é\t"]
    for sp in (GridAgentEnv.system_prompt, None, ""):
        for x in texts:
            assert rollout.prompt_text(tok, x, sp) == tok.apply_chat_template(
                ([{"role": "system", "content": sp}] if sp else []) + [{"role": "user", "content": x}],
                add_generation_prompt=True, tokenize=False)
            assert rollout.observation_text(tok, x, sp) == rollout._observation_text(tok, x, sp)
    assert rollout.format_prompts(tok, [{"prompt": x} for x in texts]) == [
        tok.apply_chat_template([{"role": "user", "content": x}], add_generation_prompt=True,
                                tokenize=False) for x in texts]
    trimmed = tok.chat_template.replace("m['content']", "(m['content'] | trim)").replace(
        "message.content", "(message.content | trim)")
    assert "| trim" in trimmed
    monkeypatch.setattr(tok, "chat_template", trimmed)
    x = "  x  "
    assert rollout.prompt_text(tok, x) == tok.apply_chat_template(
        [{"role": "user", "content": x}], add_generation_prompt=True, tokenize=False)
    assert x not in rollout.prompt_text(tok, x)  # the template's own trim, not the frame
