"""15_pope: its checked exercises, answered right and wrong (see conftest.py)."""


def test_nb15_prefix_len(notebook, answerable):
    import math

    from agentrl_lib.algorithms import pope
    from agentrl_lib.algorithms.pope import POPEConfig

    def prefix(it, num_iters, start, end, anneal_frac, n, anneal=True):
        last = anneal_frac * num_iters if anneal else num_iters
        frac = end if it >= last else start + (end - start) * it / last
        return min(math.floor(frac * n + 1e-9), n - 1)

    answerable(prefix, lambda *x: prefix(*x, anneal=False),  # anneals over all of training
               lambda it, N, a, b, f, n: pope.prefix_len(pope.prefix_fraction(
                    it, N, POPEConfig(prefix_start=a, prefix_end=b, anneal_frac=f)), n),
               notebook("prefix_inputs"))
