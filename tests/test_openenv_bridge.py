"""OpenEnv both ways, end to end on 127.0.0.1: ``agentrl serve grid`` really started (a free port)
and stopped; a multi-turn episode played through OpenEnv's client (``OpenEnvAgentEnv``) equals the
same episode played locally; ``agent_pg.train`` through the server gives the same rows as locally
(the environment is deterministic given seed and actions, and the policy has its own generator)."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("openenv", reason="openenv-core is in [all] and requirements/lock.txt: "
                                "run make setup")

from agentrl_lib.algorithms import agent_pg  # noqa: E402
from agentrl_lib.algorithms.agent_pg import AgentPGConfig  # noqa: E402
from agentrl_lib.envs.multiturn import GridAgentEnv  # noqa: E402
from agentrl_lib.envs.openenv_bridge import OpenEnvAgentEnv, make_client_env  # noqa: E402
from agentrl_lib.models.policies import KeyTablePolicy  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
KWARGS = {"layout": ["...", ".#.", "..."], "max_turns": 4}


def make_local():
    return GridAgentEnv(**KWARGS)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "agentrl_lib.cli", "serve", "grid", "--port",
                             str(port), "--max-sessions", "8", "--kwargs", json.dumps(KWARGS)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300  # importing gradio (openenv's web UI) is slow on a busy machine
    while True:
        assert proc.poll() is None, "the server exited before it listened"
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            break
        except OSError:
            assert time.time() < deadline, "the server did not listen within 300 s"
            time.sleep(0.2)
    yield f"http://127.0.0.1:{port}", proc
    proc.terminate()
    proc.wait(timeout=30)


def test_a_multi_turn_episode_through_openenv_equals_the_local_one(server):
    url, _ = server
    remote, local = OpenEnvAgentEnv(url), make_local()
    assert remote.reset(seed=3) == local.reset(seed=3)
    assert remote.state_key() == local.state_key()
    assert remote.actions == local.actions and remote.max_turns == local.max_turns
    turns = 0
    for a in ["left", "up", "up", "right", "down"]:
        r_obs, r_rew, r_done, r_info = remote.step(a)
        l_obs, l_rew, l_done, l_info = local.step(a)
        turns += 1
        assert (r_obs, r_rew, r_done) == (l_obs, l_rew, l_done)
        assert r_info["state_key"] == l_info["state_key"]
        assert r_info["valid"] == l_info["valid"] and r_info["truncated"] == l_info["truncated"]
        if l_done:
            break
    assert turns > 1  # the session kept the episode's state across several messages
    assert remote._client is None  # the session was closed at the episode's end


def test_agent_pg_trains_through_openenv_as_it_does_locally(server):
    url, _ = server
    cfg = AgentPGConfig(num_prompts=2, group_size=2, num_iters=3, eval_every=3, lr=0.5)
    rows = {}
    for name, make_env in (("local", make_local), ("served", make_client_env(url))):
        pol = KeyTablePolicy(4, seed=0)
        out = agent_pg.train(make_env, pol, cfg, list(range(6)))
        rows[name] = [{k: v for k, v in r.items() if not k.startswith("time/")} for r in out]
        assert float(pol.logits.detach().abs().sum()) > 0  # the table moved
    assert len(rows["served"]) == 3 and rows["served"] == rows["local"]


def test_the_server_stops_and_leaves_no_process(server):
    url, proc = server
    proc.terminate()
    proc.wait(timeout=30)
    assert proc.returncode is not None
    with pytest.raises(ProcessLookupError):
        os.kill(proc.pid, 0)
    port = int(url.rsplit(":", 1)[1])
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), 0.5).close()
