"""Pretraining on the project's corpora (``sft.PretrainConfig``) and SFT bases that start from a
checkpoint (``init``): the documents, the cache, the hand-over of weights, and the clear refusals."""

import json
from dataclasses import replace

import pytest
import torch

from agentrl_lib.algorithms import sft
from agentrl_lib.algorithms.sft import PretrainConfig, SFTConfig
from agentrl_lib.models.tiny_lm import SIZES, char_tokenizer, new_model

TINY = dict(size="tiny-64", device="cpu")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    torch.set_num_threads(1)
    return tmp_path


def test_documents_are_worked_tasks_and_agent_conversations():
    tok = char_tokenizer()
    cfg = PretrainConfig(corpora=("chain", "grid"), docs_per_corpus=8, **TINY)
    docs = sft.pretrain_documents(cfg, tok)
    assert len(docs) == 8 + 8  # 2 chain problems at each of 4 difficulties, 8 episodes
    chain = tok.decode(docs[0])
    assert chain.startswith("<|im_start|>user\n") and "answer " in chain and "=" in chain
    grid = tok.decode(docs[-1])
    assert "Reach the goal" in grid and grid.count("<|im_start|>assistant") >= 1
    with pytest.raises(ValueError, match="unknown corpus 'poems'"):
        sft.pretrain_documents(PretrainConfig(corpora=("poems",), **TINY), tok)


def test_pretrain_then_sft_from_it(cache):
    pt = PretrainConfig(corpora=("arithmetic", "grid"), docs_per_corpus=16, steps=4, batch_size=4,
                        lr=1e-3, **TINY)
    path = sft.checkpoint(pt, verbose=False)
    assert path.parent == cache / "sft" and path.name.startswith("pretrain-tiny-64-")
    pretrained, _ = sft.load_base(pt, verbose=False)
    fresh, _ = new_model("tiny-64", seed=0)
    assert any(not torch.equal(a, b) for a, b in zip(pretrained.parameters(), fresh.parameters()))
    # an SFT base with init starts from exactly those weights (0 steps: nothing else happens)
    start = SFTConfig(task="arithmetic", steps=0, init=str(path), **TINY)
    model, _ = sft.load_base(start, verbose=False)
    for a, b in zip(model.parameters(), pretrained.parameters()):
        assert torch.equal(a, b)
    # and the init enters the cache key: another start is another base
    assert sft.config_key(start) != sft.config_key(SFTConfig(task="arithmetic", steps=0, **TINY))
    with pytest.raises(ValueError, match="size 'small-128'"):
        sft.start_model(SFTConfig(size="small-128", init=str(path)))


def test_old_cache_keys_are_unchanged_by_the_new_fields():
    base = SFTConfig(task="chain", difficulties=(1, 2, 3), steps=1500, direct_fraction=0.5,
                     tokenizer="char")
    assert sft.config_key(base) == sft.config_key(sft.BASE_MODELS["chain-mix-tiny"])
    assert sft.config_key(base) == "934a25a70f9273a5"  # the shipped folder's key
    assert all(k not in sft._identity(base) for k in ("init", "device", "tokenizer"))
    # a BPE base's key names the tokenizer's content: a rebuilt tokenizer rebuilds the bases
    bpe = replace(base, tokenizer="bpe")
    assert sft._identity(bpe)["tokenizer"] == f"bpe@{sft.tokenizer_fingerprint()}"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_gpu_bases_are_refused_without_a_gpu(cache):
    assert sft.BASE_MODELS["pretrain-medium"].device == "cuda"
    with pytest.raises(ValueError, match="trained on a GPU.*torch sees none"):
        sft.checkpoint(sft.BASE_MODELS["chain-mix-medium"], verbose=False)
    assert not any((cache / "sft").glob("*medium*"))  # nothing half-built is left behind


def test_medium_size_is_tens_of_millions():
    from transformers import Qwen2ForCausalLM

    from agentrl_lib.models.tiny_lm import model_config

    with torch.device("meta"):  # count without allocating
        n = sum(p.numel() for p in Qwen2ForCausalLM(model_config("medium-512")).parameters())
    assert 20e6 < n < 60e6 and SIZES["medium-512"]["num_hidden_layers"] == 8


def test_shipped_bases_are_current_and_fill_the_cache(cache, monkeypatch):
    """Every folder under bases/ is the checkpoint of a base of ``BASE_MODELS`` as configured now
    (a stale one fails here), and a cache miss is filled from it without training."""
    shipped = sorted(p for p in sft.SHIPPED.iterdir() if p.is_dir()) if sft.SHIPPED.is_dir() else []
    by_folder = {sft.checkpoint_path(c).name: (n, c) for n, c in sft.BASE_MODELS.items()}
    assert shipped, "no shipped bases: make test would train every base"
    for folder in shipped:
        assert folder.name in by_folder, f"{folder.name} is no base of BASE_MODELS now: remove it"
        name, cfg = by_folder[folder.name]
        assert sft._recorded(folder) == json.loads(json.dumps(sft._identity(cfg), default=list)), name
    name, cfg = by_folder[shipped[0].name]

    def no_training(*a, **k):
        raise AssertionError("trained although a shipped base matches")
    monkeypatch.setattr(sft, "train_sft", no_training)
    monkeypatch.setattr(sft, "train_agent_sft", no_training)
    path = sft.checkpoint(cfg, verbose=False)
    assert path.parent == cache / "sft"
    assert (path / "model.safetensors").read_bytes() == (shipped[0] / "model.safetensors").read_bytes()
    # `agentrl cache --shipped` (make test, make lab) fills the cache with every shipped base
    from agentrl_lib import cli

    monkeypatch.setenv("AGENTRL_QUIET", "1")  # restored afterwards (the command sets it)
    assert cli.main(["cache", "--shipped", "--quiet"]) == 0
    assert sorted(p.name for p in (cache / "sft").iterdir()) == [p.name for p in shipped]
    assert cli.main(["cache", "--shipped", "arith-tiny"]) == 2


def test_gpu_profiles_name_the_gpu_pretrained_bases():
    """The ``gpu`` profile of every LM notebook starts from a base built on the pretrained model."""
    from agentrl_lib.pipeline.notebooks import load_notebook, repo_root

    root = repo_root()
    keys = {"10_tiny_lm": "model_name", "11_grpo_vs_trl": "model_name",
            "12_tricks_or_traps": "model_name", "13_ppo_llm": "model_name",
            "30_multiturn_agent": "sft_init", "31_gigpo": "lm_base", "32_archer": "lm_base",
            "33_spa_rl": "lm_base", "34_credit_arena": "lm_base"}
    for nb, key in keys.items():
        gpu = load_notebook(root / "notebooks" / f"{nb}.ipynb", root).profiles["gpu"]
        name = gpu[key].removeprefix("agentrl-sft/")
        cfg = sft.BASE_MODELS[name]
        chain = [cfg]
        while getattr(chain[-1], "init", ""):
            chain.append(sft._init_base(chain[-1].init))
        assert isinstance(chain[-1], PretrainConfig) and chain[-1].size == "medium-512", nb
        assert gpu.get("device", "auto") == "auto" or nb.startswith("1"), nb


def test_load_base_takes_a_bare_base_name(cache):
    """``load_base("arith-tiny")`` is the named base (filled from the shipped copy), not a hub
    lookup of that name."""
    by_name, _ = sft.load_base("arith-tiny", verbose=False)
    prefixed, _ = sft.load_base("agentrl-sft/arith-tiny", verbose=False)
    for a, b in zip(by_name.parameters(), prefixed.parameters()):
        assert torch.equal(a, b)
