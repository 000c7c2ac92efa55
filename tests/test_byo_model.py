"""Bring your own model (issue 29): an LM notebook that takes ``model_name`` runs end to end on its
``ci`` profile through ``agentrl run`` with a checkpoint of another architecture and tokenizer,
written here by ``save_pretrained`` (nothing is downloaded): a GPT-2 of about 5k parameters and a
byte-level BPE tokenizer trained on a few lines, with its own chat template. Its completions earn no
reward, so the checks that need reward variance must say so and be skipped, and the run completes.

The notebooks taking ``model_name`` are 10, 11, 12 and 13 (the others take ``lm_base``, a name of
``sft.BASE_MODELS``); this file runs each, with budgets as small as ``-p`` allows, on one saved
checkpoint (a module-scoped fixture).
"""

import json
from pathlib import Path

import pytest

from agentrl_lib import cli

ROOT = Path(__file__).resolve().parents[1]
SPECIALS = ["<|pad|>", "<|eos|>", "<|user|>", "<|assistant|>"]
TEMPLATE = ("{% for m in messages %}{% if m['role'] == 'user' %}<|user|>{{ m['content'] }}"
            "{% else %}<|assistant|>{{ m['content'] }}<|eos|>{% endif %}{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def save_foreign_checkpoint(path: Path) -> int:
    """A randomly initialised GPT-2 (1 layer, width 8) and a byte-level BPE tokenizer of 284
    tokens trained here, saved with ``save_pretrained``; returns the parameter count."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()  # decodes back to the exact text (the notebooks check it)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(["3+4=7\n7*2=14\nanswer 14", "Start at 3. Add 4, times 2."] * 20,
                            trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<|pad|>",
                                  eos_token="<|eos|>", additional_special_tokens=SPECIALS[2:])
    tok.chat_template = TEMPLATE
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=len(tok), n_positions=256, n_embd=8, n_layer=1, n_head=2,
                        bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
                        pad_token_id=tok.pad_token_id)
    model = GPT2LMHeadModel(config)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return sum(p.numel() for p in model.parameters())


@pytest.fixture(scope="module")
def foreign(tmp_path_factory):
    path = tmp_path_factory.mktemp("byo") / "gpt2-bytebpe"
    return path, save_foreign_checkpoint(path)


def run_notebook(stem: str, runs: Path, params: dict) -> tuple[int, dict, str]:
    """``agentrl run <stem> --profile ci --seed 0`` with ``-p`` overrides: (exit code, results.json
    (empty if none), the executed notebook's text outputs)."""
    argv = ["run", stem, "--profile", "ci", "--seed", "0", "--runs", str(runs), "--quiet"]
    for k, v in params.items():
        argv += ["-p", k, str(v)]
    rc = cli.main(argv)
    folder = next((runs / "ci").glob(f"{stem}*/seed0"))
    res = folder / "results.json"
    executed = json.loads(next(folder.glob("*.ipynb")).read_text())
    texts = [o.get("text", "") for c in executed["cells"] for o in c.get("outputs", [])]
    outputs = "".join(t if isinstance(t, str) else "".join(t) for t in texts)
    return rc, json.loads(res.read_text()) if res.exists() else {}, outputs


def test_notebook_11_with_a_foreign_model_that_earns_no_reward(foreign, tmp_path):
    path, n_params = foreign
    tiny = dict(model_name=path, num_iters=2, num_prompts=2, group_size=2, eval_size=8,
                eval_every=1, num_train_problems=40, max_new_tokens=8, sampled_k=1)
    rc, res, outputs = run_notebook("11", tmp_path / "runs", tiny)
    assert rc == 0, outputs[-3000:]
    m = res["metrics"]
    assert res["params"]["model_name"] == str(path) and m["n_params"] == n_params
    assert m["sft_start_acc"] == 0.0 and m["mean_reward_ours"] == m["mean_reward_trl"] == 0.0
    # the check that needs reward variance: skipped, and said so (results.json and the output)
    assert m["reward_signal"] is False
    assert m["trl_gradient_check"].startswith("not evaluated: no reward variance")
    assert "no group with unequal rewards in 10 batches" in outputs
    assert "the lr = 0 controls: not evaluated (no reward signal)" in outputs
    claims = {c["id"]: c for c in res["claims"]}
    assert not claims["ours_gain"]["asserted"] and not claims["ours_gain"]["holds"]
    assert not claims["trl_gain"]["asserted"]
    assert claims["same_start"]["asserted"] and claims["same_start"]["holds"]  # still checked


TINY = {  # tiny budgets through -p: one or two updates of 2 prompts x 2, 8-token completions
    "12": dict(difficulties=[3], num_iters=1, num_prompts=2, group_size=2, eval_size=8,
               eval_every=1, max_new_tokens=8, show_widgets=False),
    "13": dict(num_train_problems=40, num_prompts=2, group_size=2, ppo_group_size=2, num_iters=2,
               eval_size=8, eval_samples=1, eval_every=1, max_new_tokens=8,
               # the design claim critic_costs_time (PPO's update at least 1.2x GRPO's) is about
               # a network whose compute dominates; a 5k-parameter one is Python-overhead bound
               # (measured 1.198: 18 vs 15 ms per update), so here it asks for "slower" at all
               time_margin=0.0),
    "10": dict(scratch_sft_steps=2, speed_prompts=2, eval_size=8, num_samples=2,
               temperatures=[1.0], show_widgets=False),
}
SAID = {  # what each notebook prints where a check needs a reward signal or a model that answers
    "12": ["the update's move: not evaluated (no group with unequal rewards)"],
    "13": ["the leak: not shown (no demo completion ends before max_new_tokens)",
           "the policy's move: not evaluated (every advantage is 0)"],
    "10": ["is not one of the project's SFT bases: sft_base_accuracy and pass_at_k_grows need a "
           "model that already answers; reported, not asserted"],
}


@pytest.mark.parametrize("stem", ["12", "13", "10"])
def test_lm_notebook_with_a_foreign_model_that_earns_no_reward(foreign, tmp_path, stem):
    path, _ = foreign
    rc, res, outputs = run_notebook(stem, tmp_path / "runs", dict(model_name=path, **TINY[stem]))
    assert rc == 0, outputs[-3000:]
    assert res["params"]["model_name"] == str(path)
    for line in SAID[stem]:
        assert line in outputs, line
    m, claims = res["metrics"], {c["id"]: c for c in res["claims"]}
    if stem == "12":
        assert m["by_hand_move_checked"] is False and m["start_acc/d3"] == 0.0
        assert all(v == 0.0 for k, v in m.items() if k.startswith("gain/"))
    elif stem == "13":
        assert m["gae_leak_shown"] is False and m["by_hand_move_checked"] is False
        assert m["acc_start_sampled"] == m["acc_start_greedy"] == 0.0
    else:
        assert m["own_base"] is False and m["acc_greedy"] == 0.0
        for cid in ("sft_base_accuracy", "pass_at_k_grows"):  # reported, with the numbers
            assert not claims[cid]["asserted"] and not claims[cid]["holds"], claims[cid]
        assert claims["cache_logps_exact"]["asserted"] and claims["cache_logps_exact"]["holds"]
