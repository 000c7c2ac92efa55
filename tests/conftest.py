"""Fixtures shared by the unit tests."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Tiny tensors and 64-unit nets run fastest on one thread (the library's loops and the
    notebooks do the same on a small CPU); restored afterwards."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(params=["bpe", "char"])
def tiny_lm(request):
    """A freshly initialised tiny-64 causal LM (seed 0, eval mode) and its tokenizer, on each of
    the two tokenizers (``tiny_lm.TOKENIZERS``)."""
    from agentrl_lib.models.tiny_lm import new_model

    model, tok = new_model("tiny-64", seed=0, tokenizer=request.param)
    return model.eval(), tok
