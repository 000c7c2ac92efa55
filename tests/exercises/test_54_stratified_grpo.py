"""54_stratified_grpo: its checked exercises, answered right and wrong (see conftest.py)."""


def test_nb54_san_advantages(notebook, answerable, pooled):
    from agentrl_lib.algorithms import stratified as st

    def right(R, g, k, alpha, within_group=True):
        cells = [(gi, ki) if within_group else ki for gi, ki in zip(g.tolist(), k.tolist())]
        return alpha * pooled(R, cells) + (1 - alpha) * pooled(R, g.tolist())

    answerable(right, lambda *x: right(*x, within_group=False),  # strata pooled across groups
               lambda R, g, k, a: st.san_advantages(R, g, k, alpha=a)[0], notebook("san_inputs"))
