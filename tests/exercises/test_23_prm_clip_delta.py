"""23_prm_clip_delta: its checked exercises, answered right and wrong (see conftest.py)."""

import numpy as np


def test_nb23_clip_and_delta(notebook, answerable):
    from agentrl_lib.rewards import process as pr

    def right(scores, step_mask, success, kind, eta, peek_past_end=False):
        s, m, ok = (np.asarray(x, dtype=float) for x in (scores, step_mask, success))
        B, T = s.shape
        out = np.zeros((B, T + 1))
        for b in range(B):
            K = int(m[b].sum())
            for k in range(K):
                if kind == "clip":
                    out[b, k] = min(s[b, k] - eta, 0.0)
                else:
                    nxt = s[b, k + 1] if k + 1 < (T if peek_past_end else K) else 0.0
                    out[b, k] = s[b, k] - nxt
            out[b, K] += ok[b]
        return out

    answerable(right, lambda *x: right(*x, peek_past_end=True),  # Delta reads the padding's score
               lambda s, m, ok, kind, eta: pr.process_rewards(s, m, ok, kind, eta=eta)[0],
               notebook("process_inputs"))
