"""The second substrate's bases (issue 26, section 4): one BPE agent base per environment an LM rung
plays, each shipped (``make test`` trains none), and the positive-control script that measures them
(``reproductions/bases/positive_controls.py``): its arithmetic, its table and its errors."""

import importlib.util
import json
import math
import sys

import numpy as np
import pytest

from agentrl_lib.algorithms import sft
from agentrl_lib.models.tiny_lm import CONTEXT, load_tokenizer
from agentrl_lib.pipeline.tuning import edge_lr, pick_lr
from agentrl_lib.pipeline.notebooks import repo_root
from agentrl_lib.rollout import play_episodes, text_episodes_to_tokens

ROOT = repo_root()
SCRIPT = ROOT / "reproductions" / "bases" / "positive_controls.py"


def controls_module():
    spec = importlib.util.spec_from_file_location("positive_controls", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclass looks itself up there
    spec.loader.exec_module(mod)
    return mod


PC = controls_module()
AGENT = {env: c for env, c in PC.CONTROLS.items() if not PC.is_task(c)}


def test_every_control_names_a_shipped_bpe_base():
    """Each control's base is a BPE tiny base of ``BASE_MODELS`` whose checkpoint is in bases/, so
    no notebook or test ever trains one."""
    shipped = {p.name for p in sft.SHIPPED.iterdir() if p.is_dir()}
    for env, ctl in PC.CONTROLS.items():
        cfg = sft.BASE_MODELS[ctl.base]
        assert (cfg.tokenizer, cfg.size) == ("bpe", "tiny-64"), env
        assert sft.checkpoint_path(cfg).name in shipped, f"{ctl.base} is not shipped"


@pytest.mark.parametrize("env", sorted(AGENT))
def test_agent_base_plays_its_environment_with_its_own_prompt(env):
    """An agent base's config names its environment's own system prompt and turn cap, and the
    environment's longest demonstration fits the BPE context with room (a quarter of it)."""
    cfg = sft.BASE_MODELS[AGENT[env].base]
    made = sft.sft_env(cfg.env, **cfg.env_kwargs)
    assert cfg.max_turns == made.max_turns
    assert cfg.system_prompt == (getattr(made, "system_prompt", "") or "")
    tok = load_tokenizer("bpe")
    eps = play_episodes(lambda: sft.sft_env(cfg.env, **cfg.env_kwargs),
                        sft.scripted_policy(cfg.epsilon, np.random.default_rng(0)),
                        [cfg.seed_offset + i for i in range(8)], 1, cfg.max_turns)
    text_episodes_to_tokens(tok, eps, cfg.system_prompt)
    longest = max(len(ep.prompt_ids) + len(ep.token_ids) for ep in eps)
    assert longest <= 3 * CONTEXT["bpe"] // 4, (env, longest)


def test_committed_rows_are_consistent_and_the_table_renders_them():
    """Every committed control row's standard errors and lift follow from its own numbers, and the
    table's verdict columns are those numbers against the fixed targets."""
    rows = [json.loads(p.read_text()) for p in sorted((SCRIPT.parent / "controls").rglob("*.json"))]
    assert rows, "no committed controls"
    for r in rows:
        se = lambda p: math.sqrt(max(p * (1 - p), 1e-12) / r["panel_episodes"])  # noqa: E731
        assert r["se_start"] == pytest.approx(se(r["start"]))
        assert r["se_final"] == pytest.approx(se(r["final"]))
        lift = (r["final"] - r["start"]) / math.hypot(r["se_start"], r["se_final"])
        assert r["lift_se"] == pytest.approx(lift)
        assert r["panel_episodes"] >= 256 and r["env"] in PC.CONTROLS
        sweep = {float(k): v for k, v in r["sweep"].items()}
        assert r["lr"] == pick_lr(sweep)  # the one rule, re-derived
        replay = {lr: sweep[lr] for lr in PC.LRS}  # and the edge rule, replayed
        for added in r.get("extended", []):
            assert edge_lr(replay) == added
            replay[added] = sweep[added]
        assert replay == sweep
        if "extended" in r:  # rows from before the rule (first_pass/, second_pass/) lack it
            assert len(r["extended"]) == PC.EDGE_STEPS or edge_lr(replay) is None
    table = PC.table()  # the judged rows; first_pass/ and second_pass/ are the protocol's history
    judged = [json.loads(p.read_text()) for p in (SCRIPT.parent / "controls").glob("*.json")]
    for r in judged:
        # the table's rows are judged on the large panel, every one (the script's docstring)
        assert "extended" in r and r["panel_first"] == PC.PANEL_LARGE, r["env"]
        assert r["panel_episodes"] >= 1024, r["env"]
        line = next(ln for ln in table.splitlines() if ln.startswith(f"| {r['env']} |"))
        cells = [c.strip() for c in line.strip("|").split("|")]
        want = ["yes" if ok else "no" for ok in (0.2 <= r["start"] <= 0.7, r["lift_se"] >= 3,
                                                   PC.run_min(r) <= 5)]
        assert cells[-3:] == want


def test_unknown_environment_is_one_clear_error(capsys):
    with pytest.raises(SystemExit, match="unknown environment.*'maze'.*choose from"):
        PC.main(["maze"])
