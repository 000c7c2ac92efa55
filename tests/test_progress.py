"""Progress bars (utils.progress): shown in a terminal or JupyterLab, quiet under --quiet, in CI
and in headless runs; the library's long loops use them."""

import pytest

from agentrl_lib import utils
from agentrl_lib.algorithms import loop

FLAGS = ("AGENTRL_QUIET", "CI", "AGENTRL_HEADLESS")


@pytest.fixture
def loud(monkeypatch):
    for k in FLAGS:
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def test_progress_enabled_follows_the_environment(loud):
    assert utils.progress_enabled()
    for k in FLAGS:
        loud.setenv(k, "1")
        assert not utils.progress_enabled(), k
        loud.setenv(k, "0")  # an explicit off is not on
        assert utils.progress_enabled(), k
        loud.delenv(k)
    loud.setenv("CI", "true")
    assert not utils.progress_enabled()


class _Batch:
    metrics = {"rollout/reward": 0.5}


def _run_loop():
    class M:
        def eval(self):
            pass

    return loop.run(M(), lambda m, it: _Batch(), lambda b, it: {"losses/loss": 1.0}, num_iters=3,
                    evaluate=lambda m: {"acc": 0.0}, eval_every=10)


def test_the_lm_loop_shows_a_bar_unless_quiet(loud, capsys):
    rows = _run_loop()
    err = capsys.readouterr().err
    assert len(rows) == 4 and "updates:" in err and "/3 [" in err  # tqdm text bar on stderr
    loud.setenv("AGENTRL_QUIET", "1")
    quiet = _run_loop()
    assert [r["iter"] for r in quiet] == [r["iter"] for r in rows]
    assert capsys.readouterr().err == ""
