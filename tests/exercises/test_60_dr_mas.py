"""60_dr_mas: its checked exercises, answered right and wrong (see conftest.py)."""


def test_nb60_agent_normalise_and_second_moment(notebook, answerable, pooled):
    from agentrl_lib.algorithms import dr_mas

    def right_norm(r, g, k):
        return pooled(r, list(zip(g.tolist(), k.tolist())))

    def wrong_norm(r, g, k):  # one pool per group: vanilla GRPO over the agents
        return pooled(r, g.tolist())

    def right_moment(r_k, r_all, ddof=0):
        mu_k, mu = sum(r_k) / len(r_k), sum(r_all) / len(r_all)
        var_k = sum((x - mu_k) ** 2 for x in r_k) / (len(r_k) - ddof)
        var = sum((x - mu) ** 2 for x in r_all) / (len(r_all) - ddof)
        return (var_k + (mu_k - mu) ** 2) / var

    answerable(right_norm, wrong_norm,
               lambda r, g, k: dr_mas.normalise_rewards(r, g, k, "agent"),
               notebook("normalise_inputs"))
    answerable(right_moment, lambda *x: right_moment(*x, ddof=1),  # sample variances
               dr_mas.global_second_moment, notebook("moment_inputs"))
