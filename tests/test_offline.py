"""No telemetry, no hub calls (``agentrl_lib.offline``): importing the package sets the switches
the user has not set, for itself and what it starts, and a TRL trainer created after it tries no
connection. The control (the switches turned off) shows the network guard sees TRL's ping."""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from agentrl_lib import offline

ROOT = Path(__file__).resolve().parents[1]


def _fresh_python(code: str, env_extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in offline.SWITCHES}
    env.update(env_extra, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_sets_the_switches_and_keeps_the_users():
    code = ("import json, os, subprocess, sys, agentrl_lib, huggingface_hub.constants as c\n"
            "child = subprocess.run([sys.executable, '-c', 'import os; print(os.environ.get("
            "\"HF_HUB_DISABLE_TELEMETRY\"))'], capture_output=True, text=True).stdout.strip()\n"
            "print(json.dumps({'env': {k: os.environ.get(k) for k in agentrl_lib.offline.SWITCHES},"
            " 'offline': c.HF_HUB_OFFLINE, 'telemetry_off': c.HF_HUB_DISABLE_TELEMETRY,"
            " 'child': child}))")
    got = _fresh_python(code, {})
    assert got["env"] == offline.SWITCHES
    assert got["offline"] is True and got["telemetry_off"] is True
    assert got["child"] == "1"  # a subprocess inherits them
    got = _fresh_python(code, {"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "0"})
    assert got["env"]["HF_HUB_OFFLINE"] == "0" and got["env"]["TRANSFORMERS_OFFLINE"] == "0"
    assert got["offline"] is False and got["telemetry_off"] is True


def test_hub_imported_before_us_is_switched_too():
    code = ("import json, huggingface_hub.constants as c\n"
            "before = (c.HF_HUB_OFFLINE, c.HF_HUB_DISABLE_TELEMETRY)\n"
            "import agentrl_lib\n"
            "print(json.dumps([before, [c.HF_HUB_OFFLINE, c.HF_HUB_DISABLE_TELEMETRY]]))")
    before, after = _fresh_python(code, {})
    assert before == [False, False] and after == [True, True]


class NetworkGuard:
    """Refuses (OSError) and records every name lookup and connection to a host that is not this
    machine, as a machine without a network would."""

    LOCAL = ("localhost", "127.0.0.1", "::1", "0.0.0.0", "")

    def __init__(self, monkeypatch):
        self.tried = []
        real_getaddrinfo, real_connect = socket.getaddrinfo, socket.socket.connect

        def getaddrinfo(host, *a, **k):
            self._check(host)
            return real_getaddrinfo(host, *a, **k)

        def connect(sock, address):
            if isinstance(address, tuple):
                self._check(address[0])
            return real_connect(sock, address)

        monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
        monkeypatch.setattr(socket.socket, "connect", connect)

    def _check(self, host):
        host = host.decode() if isinstance(host, bytes) else str(host or "")
        if host not in self.LOCAL:
            self.tried.append(host)
            raise OSError(f"network blocked by the test: {host}")


def _make_trainer_and_wait():
    """A tiny GRPOTrainer (as tests/test_trl_adapter.py builds it), then wait until the hub's
    telemetry thread, if TRL started it, has sent (or failed to send) what it queued."""
    from huggingface_hub.utils import _telemetry

    from agentrl_lib.algorithms import trl_adapter
    from agentrl_lib.algorithms.grpo import GRPOConfig
    from agentrl_lib.envs.text_tasks import make_problems
    from agentrl_lib.models.loading import load_policy
    from agentrl_lib.models.tiny_lm import new_model

    model, tok = new_model("tiny-64", seed=0)
    folder = tempfile.mkdtemp()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    model, tok = load_policy(folder)
    probs = make_problems("arithmetic", 8, 2, "train", seed=0)
    cfg = GRPOConfig(num_prompts=2, group_size=4, num_iters=1, max_new_tokens=3, lr=1e-3)
    trainer = trl_adapter.make_trainer(model, tok, probs, [lambda completions, **kw: [0.0] *
                                                           len(completions)], cfg,
                                       tempfile.mkdtemp())
    deadline = time.time() + 30
    while _telemetry._TELEMETRY_QUEUE.unfinished_tasks and time.time() < deadline:
        time.sleep(0.05)
    return trainer


@pytest.mark.parametrize("switches_on", [True, False], ids=["switched-off-net", "control"])
def test_a_trl_trainer_tries_no_network(monkeypatch, switches_on):
    pytest.importorskip("trl")
    import huggingface_hub.constants as c

    monkeypatch.delenv("CI", raising=False)  # TRL skips its ping under CI: not what users run
    if not switches_on:  # the control: what a user without agentrl_lib's switches gets
        monkeypatch.setattr(c, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(c, "HF_HUB_DISABLE_TELEMETRY", False)
    else:
        assert os.environ["HF_HUB_DISABLE_TELEMETRY"] == "1" or c.HF_HUB_DISABLE_TELEMETRY
    guard = NetworkGuard(monkeypatch)
    _make_trainer_and_wait()
    if switches_on:
        assert guard.tried == []
    else:
        assert any("huggingface" in h for h in guard.tried), guard.tried
