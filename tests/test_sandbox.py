"""The sandbox for model-written programs: each limit holds (CPU time, wall clock, memory, network,
file writes, processes), the program's own failures come back as reasons, and the caller never
hangs or crashes."""

import os
import time

import pytest

from agentrl_lib.envs.sandbox import REASONS, run_python


def test_a_program_runs_and_returns_its_result():
    r = run_python("result = sum(inputs['xs']) * 2\nprint('hello')", {"xs": [1, 2, 3]})
    assert r.ok and r.value == 12 and r.reason == "ok" and r.stdout == "hello\n"


def test_reading_is_allowed():
    r = run_python("result = open(inputs['p']).read()[:5]", {"p": __file__})
    assert r.ok and r.value == '"""Th'


def test_the_programs_exception_is_a_reason_not_a_crash():
    r = run_python("result = 1 / 0")
    assert not r.ok and r.reason == "error" and r.error.startswith("ZeroDivisionError")
    r = run_python("def f(n): return f(n + 1)\nresult = f(0)")
    assert r.reason == "error" and "RecursionError" in r.error
    r = run_python("result = {1, 2}")  # a set is not JSON
    assert r.reason == "bad_result" and "JSON" in r.error


def test_cpu_time_limit_stops_an_infinite_loop():
    t0 = time.perf_counter()
    r = run_python("while True:\n    pass", cpu_s=0.5)
    assert not r.ok and r.reason == "cpu_time" and "CPU-time" in r.error
    assert time.perf_counter() - t0 < 5  # the kernel stops it (rounded up to 1 s of CPU), not us


def test_wall_clock_limit_stops_a_sleeper():
    t0 = time.perf_counter()
    r = run_python("import time\ntime.sleep(30)", cpu_s=1, wall_s=1.0)
    assert r.reason == "wall_time" and "wall-clock" in r.error
    assert time.perf_counter() - t0 < 5


@pytest.mark.parametrize("bomb", ["x = bytearray(2 * 1024 ** 3)", "x = [0] * (10 ** 9)",
                                  "x = []\nwhile True:\n    x.append(' ' * 10 ** 6)"])
def test_memory_limit_stops_a_memory_bomb(bomb):
    r = run_python(bomb, memory_mb=128, cpu_s=5)
    assert not r.ok and r.reason == "memory", r


@pytest.mark.parametrize("code", [
    "import socket\ns = socket.socket()",
    "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)",
    "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:9')",
])
def test_no_network(code):
    r = run_python(code)
    assert not r.ok and r.reason == "network" and "not allowed" in r.error


@pytest.mark.parametrize("how", ["open(p, 'w').write('x')", "open(p, 'a')", "open(p, 'x')",
                                 "open(p, 'r+')", "import os\nos.open(p, os.O_WRONLY | os.O_CREAT)",
                                 "import pathlib\npathlib.Path(p).write_text('x')"])
def test_no_file_writes(how, tmp_path):
    p = tmp_path / "out.txt"
    r = run_python(f"p = inputs['p']\n{how}", {"p": str(p)})
    assert not r.ok and r.reason == "file_write", r
    assert not p.exists()


def test_no_deleting_and_no_processes(tmp_path):
    keep = tmp_path / "keep.txt"
    keep.write_text("x")
    r = run_python("import os\nos.remove(inputs['p'])", {"p": str(keep)})
    assert r.reason == "file_write" and keep.exists()
    for code in ("import subprocess\nsubprocess.run(['true'])", "import os\nos.system('true')",
                 "import os\nos.fork()", "import ctypes"):
        r = run_python(code)
        assert not r.ok and r.reason == "process", (code, r)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="cpu_s"):
        run_python("result = 1", cpu_s=0)
    with pytest.raises(ValueError, match="memory_mb"):
        run_python("result = 1", memory_mb=8)
    with pytest.raises(ValueError, match="JSON"):
        run_python("result = 1", {"x": object()})
    with pytest.raises(ValueError, match="string"):
        run_python(lambda: 1)


def test_reasons_are_listed_and_the_parent_is_untouched():
    assert {"ok", "cpu_time", "wall_time", "memory", "network", "file_write", "process"} <= set(REASONS)
    before = os.getpid()
    run_python("import os\nos._exit(3)")  # a hard exit of the child is a crash reason
    r = run_python("import os\nos._exit(3)")
    assert r.reason == "crash" and "code 3" in r.error and os.getpid() == before
