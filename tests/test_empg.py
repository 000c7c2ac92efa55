"""EMPG (``algorithms/empg.py``): the score-norm identity of a softmax, hand-computed modulated
advantages on a three-episode batch, an independent loop implementation, edge cases (a group of
one, all-equal entropies, length-1 episodes, empty batch, bad input), the tabular credit hook and
the LM turn entropies against a direct token-level computation; the final centring (eq. 7)
against a restatement of the project page's pseudocode on token rows."""

import math

import numpy as np
import pytest
import torch

from agentrl_lib.algorithms import credit, empg
from agentrl_lib.rollout import Episode

E = math.e


def toy():
    # group 0: ep0 succeeds in 2 turns, ep1 fails in 3; group 1: ep2 alone, 1 turn
    return [Episode.of(["s", "x"], [0, 1]), Episode.of(["s", "y", "z"], [0, 0, 0]),
            Episode.of(["s"], [1], group_id=1)]


TOY_H = [np.array([0.0, 1.0]), np.array([2.0, 0.5, 1.0]), np.array([1.5])]


def test_score_norm_identity():
    # E ||e_a - pi||^2 = 1 - sum pi^2 = 1 - exp(-H_2), checked by autograd over every action
    rng = np.random.default_rng(0)
    z = rng.normal(size=(5, 4)) * 2
    want = empg.expected_score_norm_sq(z)
    for row, w in zip(z, want):
        zt = torch.tensor(row, requires_grad=True)
        p = torch.softmax(zt, -1).detach().numpy()
        total = 0.0
        for a in range(4):
            (g,) = torch.autograd.grad(torch.log_softmax(zt, -1)[a], zt)
            total += p[a] * float((g ** 2).sum())
        assert total == pytest.approx(w, abs=1e-12)
        assert w == pytest.approx(1 - math.exp(-empg.renyi2_entropy(p)), abs=1e-12)
    # uniform over 4: 3/4; one-hot: 0; Shannon of uniform is log 4 and H_2 <= H
    assert empg.expected_score_norm_sq(np.zeros(4)) == pytest.approx(0.75)
    assert empg.expected_score_norm_sq(np.array([50.0, 0, 0, 0])) == pytest.approx(0, abs=1e-12)
    assert empg.shannon_entropy(np.full(4, 0.25)) == pytest.approx(math.log(4))
    p = np.array([0.7, 0.2, 0.1, 0.0])
    assert empg.renyi2_entropy(p) <= empg.shannon_entropy(p)
    assert empg.shannon_entropy(np.array([1.0, 0.0])) == 0.0


def test_hand_computed_batch():
    eps = toy()
    # mean_norm GRPO: A = +0.5, -0.5 (group 0), 0 (group of one)
    # H~ (min 0, max 2): [0, .5], [1, .25, .5], [.75]
    raw = [[1, E ** -.5], [E ** -1, E ** -.25, E ** -.5], [E ** -.75]]
    m = sum(sum(r) for r in raw) / 6
    want = [[1 / m * 0.5 + 0.1 * E ** -.5, E ** -.5 / m * 0.5],
            [E ** -1 / m * -0.5 + 0.1 * E ** -.25, E ** -.25 / m * -0.5 + 0.1 * E ** -.5,
             E ** -.5 / m * -0.5],
            [0.0]]
    got = empg.empg_advantages(eps, TOY_H, k=1.0, k_prime=1.0, zeta=0.1, norm_adv=False,
                               eps_h=0.0, final_norm="none")
    for g, w in zip(got, want):
        assert np.allclose(g, w, atol=1e-12), (g, w)
    # g has batch mean 1; the final step (eq. 7) centres over the 6 turns, no std
    g = np.concatenate(empg.modulation(empg.normalise_entropies(TOY_H, 0.0), 1.0))
    assert g.mean() == pytest.approx(1.0)
    flat = np.concatenate([np.array(w) for w in want])
    fin = np.concatenate(empg.empg_advantages(eps, TOY_H, norm_adv=False, eps_h=0.0))
    assert np.allclose(fin, flat - flat.mean(), atol=1e-12)
    assert fin.mean() == pytest.approx(0, abs=1e-12) and fin.std() == pytest.approx(flat.std())
    # the named variant 'batch' (ours) also divides by the batch std (ddof 1)
    std = np.concatenate(empg.empg_advantages(eps, TOY_H, norm_adv=False, eps_h=0.0, eps=0.0,
                                              final_norm="batch"))
    assert np.allclose(std, (flat - flat.mean()) / flat.std(ddof=1), atol=1e-12)
    assert std.mean() == pytest.approx(0, abs=1e-12) and std.std(ddof=1) == pytest.approx(1.0)


def loop_empg(episodes, entropies, k, kp, zeta, norm_adv=True, ddof=1, eps=1e-4, eps_h=1e-8,
              final="center"):
    """Independent implementation: plain loops, GRPO from scratch."""
    rets = [sum(ep.rewards) for ep in episodes]
    a = []
    for i, ep in enumerate(episodes):
        grp = [rets[j] for j, e in enumerate(episodes) if e.group_id == ep.group_id]
        if len(grp) < 2 or len(set(grp)) == 1:
            a.append(0.0)
            continue
        mu = sum(grp) / len(grp)
        sd = math.sqrt(sum((x - mu) ** 2 for x in grp) / (len(grp) - ddof))
        a.append((rets[i] - mu) / (sd + eps) if norm_adv else rets[i] - mu)
    all_h = [h for hs in entropies for h in hs]
    lo, hi = min(all_h), max(all_h)
    hn = [[(h - lo) / (hi - lo + eps_h) for h in hs] for hs in entropies]
    mean_raw = sum(math.exp(-k * h) for hs in hn for h in hs) / len(all_h)
    mod = []
    for i, hs in enumerate(hn):
        for t, h in enumerate(hs):
            f = zeta * math.exp(-kp * hs[t + 1]) if t + 1 < len(hs) else 0.0
            mod.append(math.exp(-k * h) / mean_raw * a[i] + f)
    mu = sum(mod) / len(mod)
    if final == "center":
        return [x - mu for x in mod]
    sd = math.sqrt(sum((x - mu) ** 2 for x in mod) / (len(mod) - ddof))
    return [(x - mu) / (sd + eps) for x in mod]


def test_matches_independent_loop_on_random_batches():
    rng = np.random.default_rng(3)
    for trial in range(5):
        eps = []
        for gid in range(3):
            for _ in range(int(rng.integers(1, 5))):
                T = int(rng.integers(1, 6))
                r = [0.0] * (T - 1) + [float(rng.integers(0, 2))]
                eps.append(Episode.of(["s"] * T, r, group_id=gid))
        ents = [rng.uniform(0, 1.4, size=len(ep)) for ep in eps]
        k, kp, zeta = rng.uniform(0, 3), rng.uniform(0, 3), rng.uniform(0, 0.5)
        got = np.concatenate(empg.empg_advantages(eps, ents, k=k, k_prime=kp, zeta=zeta))
        assert np.allclose(got, loop_empg(eps, ents, k, kp, zeta), atol=1e-10)
        std = np.concatenate(empg.empg_advantages(eps, ents, k=k, k_prime=kp, zeta=zeta,
                                                  final_norm="batch"))
        assert np.allclose(std, loop_empg(eps, ents, k, kp, zeta, final="batch"), atol=1e-10)


def pseudocode_empg(token_adv, segments, step_h, k=1.0, k_f=1.0, zeta=0.1):
    """The project page's ``compute_empg_advantage`` on token rows, restated: ``token_adv`` (B, L)
    the trainer's advantages, ``segments`` [(row, start, end)] in order (a row's steps
    consecutive), ``step_h`` one entropy per segment. g_H and f_H (eqs. 12, 10, 11, eps 1e-8 in
    both denominators), each segment's tokens scaled by its g_H (the pseudocode's
    ``advantages *= g_H[i]``, read per segment) plus zeta f_H of the next segment of the same
    row; then eq. 7: the mean of one value per step (its first token) subtracted from every
    token. Returns the (B, L) tensor."""
    h = np.asarray(step_h, dtype=np.float64)
    h_norm = (h - h.min()) / (h.max() - h.min() + 1e-8)
    g_raw = np.exp(-k * h_norm)
    g_h, f_h = g_raw / (g_raw.mean() + 1e-8), np.exp(-k_f * h_norm)
    adv = token_adv.copy()
    step_vals = []
    for i, (row, start, end) in enumerate(segments):
        adv[row, start:end] *= g_h[i]
        if i + 1 < len(segments) and segments[i + 1][0] == row:
            adv[row, start:end] += zeta * f_h[i + 1]
        step_vals.append(adv[row, start])
    return adv - np.mean(step_vals)


def test_centring_matches_the_pseudocode_on_token_rows():
    rng = np.random.default_rng(7)
    eps = []
    for gid in range(2):
        for _ in range(3):
            T = int(rng.integers(1, 5))
            eps.append(Episode.of(["s"] * T, [0.0] * (T - 1) + [float(rng.integers(0, 2))],
                                  group_id=gid))
    ents = [rng.uniform(0, 1.4, size=len(ep)) for ep in eps]
    base = credit.grpo_broadcast(eps)  # the trainer's advantage, one value per episode
    L = 3 * max(len(ep) for ep in eps) + 2
    token_adv = np.zeros((len(eps), L))
    segments = []
    for row, ep in enumerate(eps):  # each step 3 tokens, one separator token between steps
        for t in range(len(ep)):
            segments.append((row, 1 + 3 * t, 1 + 3 * t + 3))
        token_adv[row, :] = base[row][0]
    ref = pseudocode_empg(token_adv, segments, np.concatenate(ents))
    got = empg.empg_advantages(eps, ents, eps_h=1e-8)
    for row, ep in enumerate(eps):
        want = [ref[row, 1 + 3 * t] for t in range(len(ep))]
        # every token of a step carries the step's value; g's 1e-8 is the only difference
        assert np.allclose(got[row], want, rtol=1e-7, atol=1e-7), (row, got[row], want)
        for t in range(len(ep)):
            assert np.allclose(ref[row, 1 + 3 * t: 4 + 3 * t], want[t], atol=1e-12)


def test_reduces_to_grpo_and_edge_cases():
    eps = toy()
    base = credit.grpo_broadcast(eps)
    got = empg.empg_advantages(eps, TOY_H, k=0.0, zeta=0.0, final_norm="none")
    assert all(np.array_equal(a, b) for a, b in zip(got, base))
    # all-equal entropies: g = 1 everywhere, the bonus is zeta * exp(0) on every non-last turn
    flat_h = [np.full(len(ep), 0.7) for ep in eps]
    got = empg.empg_advantages(eps, flat_h, zeta=0.1, final_norm="none", norm_adv=False)
    assert np.allclose(got[0], [0.5 + 0.1, 0.5]) and np.allclose(got[1], [-0.4, -0.4, -0.5])
    assert np.allclose(got[2], [0.0])  # a group of one and a length-1 episode: nothing
    # a batch whose modulated advantages are all equal: exactly zero after the final norm
    one = [Episode.of(["s"], [1.0]), Episode.of(["s"], [0.0], group_id=1)]
    assert all(np.array_equal(a, [0.0]) for a in empg.empg_advantages(one, [[0.3], [0.1]]))
    assert empg.empg_advantages([], []) == []
    # linear bonus: -zeta * H~_{t+1}
    lin = empg.clarity_bonus([np.array([0.0, 0.5, 1.0])], zeta=0.2, bonus="linear")[0]
    assert np.allclose(lin, [-0.1, -0.2, 0.0])
    # base_advantages replaces GRPO's (e.g. GiGPO's per-turn advantage)
    gi = credit.gigpo_advantages(eps, gamma=0.95)
    got = empg.empg_advantages(eps, TOY_H, k=0.0, zeta=0.0, final_norm="none", base_advantages=gi)
    assert all(np.allclose(a, b) for a, b in zip(got, gi))


def test_bad_input_is_named():
    eps = toy()
    with pytest.raises(ValueError, match="2 entropy arrays for 3 episodes"):
        empg.empg_advantages(eps, TOY_H[:2])
    with pytest.raises(ValueError, match="episode 1 has 3 turns but 2 entropies"):
        empg.empg_advantages(eps, [TOY_H[0], TOY_H[0], TOY_H[2]])
    with pytest.raises(ValueError, match="negative"):
        empg.empg_advantages(eps, [TOY_H[0], -TOY_H[1], TOY_H[2]])
    with pytest.raises(ValueError, match="bonus"):
        empg.empg_advantages(eps, TOY_H, bonus="square")
    with pytest.raises(ValueError, match="final_norm"):
        empg.empg_advantages(eps, TOY_H, final_norm="group")
    with pytest.raises(ValueError, match="5 values for 6 turns"):
        empg.split_turns(np.zeros(5), eps)


def test_table_credit_uses_policy_entropies():
    from agentrl_lib.models.policies import KeyTablePolicy
    pol = KeyTablePolicy(3)
    eps = toy()
    with torch.no_grad():
        pol.logits[pol.row("x")] = torch.tensor([4.0, 0.0, 0.0], dtype=torch.float64)
    fn = empg.table_credit(pol, zeta=0.1, norm_adv=False)
    ents = empg.split_turns(pol.episode_entropies(eps), eps)
    assert ents[0][0] == pytest.approx(math.log(3)) and ents[0][1] < math.log(3)
    got = fn(eps)
    want = empg.empg_advantages(eps, ents, zeta=0.1, norm_adv=False)
    assert all(np.allclose(a, b) for a, b in zip(got, want))
    # the confident turn x of the successful episode gets the largest advantage
    assert np.argmax(np.concatenate(got)) == 1


def test_lm_turn_entropies_match_direct_computation(tiny_lm):
    from agentrl_lib.envs.multiturn import GridAgentEnv
    from agentrl_lib.rollout import lm_rollout
    model, tok = tiny_lm
    eps = lm_rollout(model, tok, lambda: GridAgentEnv(layout=["...", ".#.", "..."], max_turns=3),
                     [0, 1], group_size=2, max_turns=3, max_new_tokens=5,
                     generator=torch.Generator().manual_seed(0))
    got = empg.lm_turn_entropies(model, eps, batch_size=3)
    for ep, h in zip(eps, got):
        assert h.shape == (len(ep),)
        ids = torch.tensor([list(ep.prompt_ids) + list(ep.token_ids)])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
        ent = -(logp.exp() * logp).sum(-1).numpy()
        off = len(ep.prompt_ids)
        want = [ent[off + s - 1: off + e - 1].mean() for s, e in ep.turn_spans]
        assert np.allclose(h, want, atol=1e-4)
    fn = empg.lm_credit(model, zeta=0.1)
    adv = fn(eps)
    assert len(adv) == len(eps) and "empg/turn_entropy" in fn.metrics
