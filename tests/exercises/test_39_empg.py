"""39_empg: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np


def test_nb39_score_norm_and_empg_modulation(notebook, answerable):
    from agentrl_lib.algorithms import empg

    def right_score(logits, squared_probs=True):
        out = np.zeros(logits.shape[:-1])
        for idx in np.ndindex(out.shape):
            z = logits[idx]
            p = np.exp(z - z.max())
            p /= p.sum()
            # E_a ||e_a - p||^2, summed over the actions
            A = len(p)
            out[idx] = sum(p[a] * sum(((b == a) - p[b]) ** 2 for b in range(A)) for a in range(A))
            if not squared_probs:  # the Shannon entropy, the quantity it is often confused with
                out[idx] = -(p * np.log(p)).sum()
        return out

    def right_empg(base, entropies, k, k_prime, zeta, bonus_same_turn=False):
        flat = np.concatenate(entropies)
        lo, hi = flat.min(), flat.max()
        hn = [(h - lo) / (hi - lo + 1e-8) for h in entropies]
        raw = [np.exp(-k * h) for h in hn]
        mean_raw = np.concatenate(raw).mean()
        out = []
        for a, h, r in zip(base, hn, raw):
            f = np.zeros(len(h))
            for t in range(len(h)):
                if bonus_same_turn:
                    f[t] = zeta * np.exp(-k_prime * h[t])
                elif t + 1 < len(h):
                    f[t] = zeta * np.exp(-k_prime * h[t + 1])
            out.append(r / mean_raw * a + f)
        return out

    answerable(right_score, lambda z: right_score(z, squared_probs=False),
               empg.expected_score_norm_sq, notebook("logits_inputs"))
    answerable(right_empg, lambda *x: right_empg(*x, bonus_same_turn=True),  # f(H_t), not H_{t+1}
               notebook("empg_reference"), notebook("empg_inputs"))
