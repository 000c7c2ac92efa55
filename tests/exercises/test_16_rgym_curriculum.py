"""16_rgym_curriculum: its checked exercise, answered right and wrong (see conftest.py)."""


def test_nb16_next_level(notebook, answerable):
    def right(k, recent, num_levels):
        if len(recent) < 2:
            return k
        mean = (recent[-1] + recent[-2]) / 2
        if mean >= 0.7:
            return min(k + 1, num_levels - 1)
        if mean <= 0.1:
            return max(k - 1, 0)
        return k

    def wrong(k, recent, num_levels):  # never comes back down (only the 'up' half of the rule)
        if len(recent) >= 2 and (recent[-1] + recent[-2]) / 2 >= 0.7:
            return min(k + 1, num_levels - 1)
        return k

    answerable(right, wrong, notebook("next_level"), notebook("level_inputs"))
