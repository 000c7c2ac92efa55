"""The sandbox for model-written programs: each limit holds (CPU time, wall clock, memory, output,
network, file writes, processes), the program's own failures come back as reasons, and every
attack of issue 29 (1-9, written as the issue describes it) and a few more is refused or
contained with the host unchanged: each test checks the host side (the file intact, no
connection received, the caller and its process group alive, no process left), not only the
reason. Tests that need bubblewrap skip, saying so, where it does not work."""

import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from contextlib import contextmanager
from pathlib import Path

import pytest

from agentrl_lib.envs import sandbox
from agentrl_lib.envs.sandbox import REASONS, run_python

PROBLEM = sandbox.bwrap_problem()
needs_bwrap = pytest.mark.skipif(PROBLEM is not None, reason=f"needs bubblewrap: {PROBLEM}")
X86 = os.uname().machine == "x86_64"
# the weaker mode holds the write, signal, process and network attacks too (hook + seccomp filter)
MODES = ["bwrap", pytest.param("hook", marks=pytest.mark.skipif(
    not X86, reason="the seccomp filter of the hook mode is x86-64 only"))]
REPO = Path(__file__).resolve().parents[1]


def attempts(*lines):
    """Program source trying each line in turn (a refusal does not stop the next one); the
    result lists the lines that did not raise."""
    body = [f"try:\n    {line}\n    done.append({i})\nexcept BaseException:\n    pass"
            for i, line in enumerate(lines)]
    return "import os, sys\ndone = []\n" + "\n".join(body) + "\nresult = done"


def descendants():
    """{(pid, start time)} of every process below this one (read from /proc)."""
    kids, start = {}, {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                fields = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            kids.setdefault(int(fields[1]), []).append(int(d))
            start[int(d)] = fields[19]
    out, todo = set(), [os.getpid()]
    while todo:
        for k in kids.get(todo.pop(), []):
            out.add((k, start[k]))
            todo.append(k)
    return out


def alive(p):
    """Still running (a zombie, dead and waiting for its reaper, is not)."""
    try:
        fields = Path(f"/proc/{p[0]}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[19] == p[1] and fields[0] not in ("Z", "X")


@contextmanager
def no_process_left():
    """Watch this process's descendants while the block runs; afterwards none may be alive
    (an escaped grandchild is reparented away, but it was seen here first)."""
    seen, stop = set(), threading.Event()

    def watch():
        while not stop.is_set():
            seen.update(descendants())
            time.sleep(0.01)

    before = descendants()
    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        yield seen
    finally:
        stop.set()
        t.join()
    deadline = time.monotonic() + 5  # SIGKILL reaches the namespace's processes asynchronously
    while (left := [p for p in seen - before if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes left behind: {left}"


@pytest.fixture
def victim(tmp_path):
    p = tmp_path / "victim.txt"
    p.write_text("precious")
    return p


@pytest.fixture
def listener():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    s.setblocking(False)
    yield s
    with pytest.raises(BlockingIOError):  # no connection ever reached it
        s.accept()
    s.close()


@pytest.fixture
def sentinel():
    """A process in the caller's own process group: os.killpg on the caller's group kills it."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield p
    assert p.poll() is None, "the caller's process group was signalled"
    p.kill()
    p.wait()


# ---- the API: results, reasons, limits ----

@pytest.mark.parametrize("mode", MODES)
def test_a_program_runs_and_returns_its_result(mode):
    r = run_python("result = sum(inputs['xs']) * 2\nprint('hello')", {"xs": [1, 2, 3]},
                   isolation=mode)
    assert r.ok and r.value == 12 and r.reason == "ok" and r.stdout == "hello\n"
    assert r.isolation == mode


def test_reading_the_stdlib_is_allowed():
    r = run_python("import json\nresult = open(json.__file__).read()[:40]",
                   isolation="bwrap_or_hook")
    assert r.ok and r.value == open(__import__("json").__file__).read()[:40]


def test_the_programs_exception_is_a_reason_not_a_crash():
    r = run_python("result = 1 / 0", isolation="bwrap_or_hook")
    assert not r.ok and r.reason == "error" and r.error.startswith("ZeroDivisionError")
    r = run_python("def f(n): return f(n + 1)\nresult = f(0)", isolation="bwrap_or_hook")
    assert r.reason == "error" and "RecursionError" in r.error
    r = run_python("result = {1, 2}", isolation="bwrap_or_hook")  # a set is not JSON
    assert r.reason == "bad_result" and "JSON" in r.error


def test_cpu_time_limit_stops_an_infinite_loop():
    # wall_s is generous: on a loaded machine 1 s of CPU can take several seconds of wall time
    r = run_python("while True:\n    pass", cpu_s=0.5, wall_s=60, isolation="bwrap_or_hook")
    assert not r.ok and r.reason == "cpu_time" and "CPU-time" in r.error


def test_wall_clock_limit_stops_a_sleeper():
    t0 = time.perf_counter()
    with no_process_left():
        r = run_python("import time\ntime.sleep(30)", cpu_s=1, wall_s=1.0,
                       isolation="bwrap_or_hook")
    assert r.reason == "wall_time" and "wall-clock" in r.error
    assert time.perf_counter() - t0 < 20  # not the 30 s it asked for


@pytest.mark.parametrize("bomb", ["x = bytearray(2 * 1024 ** 3)", "x = [0] * (10 ** 9)",
                                  "x = []\nwhile True:\n    x.append(' ' * 10 ** 6)"])
def test_memory_limit_stops_a_memory_bomb(bomb):
    r = run_python(bomb, memory_mb=128, cpu_s=5, isolation="bwrap_or_hook")
    assert not r.ok and r.reason == "memory", r


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("how", ["open(p, 'w').write('x')", "open(p, 'a')", "open(p, 'r+')",
                                 "import os\nos.open(p, os.O_WRONLY)",
                                 "import pathlib\npathlib.Path(p).write_text('x')"])
def test_no_file_writes(how, mode, victim):
    r = run_python(f"p = inputs['p']\n{how}", {"p": str(victim)}, isolation=mode)
    assert not r.ok and r.reason in ("file_write", "error"), r
    assert victim.read_text() == "precious"


@pytest.mark.parametrize("name", ["cpu_s", "memory_mb", "wall_s", "max_output_bytes",
                                  "tmpfs_bytes"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1, "2"])
def test_bad_limits_are_one_line_errors_naming_the_argument(name, bad):
    # issue 29, attack 9: nan / inf limits gave errors not naming the argument
    with pytest.raises(ValueError, match=name) as err:
        run_python("result = 1", **{name: bad})
    assert "\n" not in str(err.value)


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="memory_mb"):
        run_python("result = 1", memory_mb=8)
    with pytest.raises(ValueError, match="JSON"):
        run_python("result = 1", {"x": object()})
    with pytest.raises(ValueError, match="string"):
        run_python(lambda: 1)
    with pytest.raises(ValueError, match="isolation"):
        run_python("result = 1", isolation="none")


def test_reasons_are_a_closed_set_and_a_hard_exit_is_a_crash():
    assert {"ok", "cpu_time", "wall_time", "memory", "network", "file_write", "process",
            "output_limit", "no_isolation"} <= set(REASONS)
    r = run_python("import os\nos._exit(3)", isolation="bwrap_or_hook")
    assert r.reason == "crash" and "code 3" in r.error
    # the caller's parser lets no reason outside the set through
    assert sandbox._parse(b'{"reason": "pwned", "value": 1}') is None
    assert sandbox._parse(b"[" * 100_000) is None and sandbox._parse(b"\xff") is None


# ---- issue 29's attacks 1-9, as the issue describes them ----

@needs_bwrap
@pytest.mark.parametrize("mode", MODES)
def test_attack_1_turning_the_hook_off(mode, victim, listener, sentinel):
    port = listener.getsockname()[1]
    r = run_python(attempts(
        "sys.modules['__main__']._hook.__code__ = (lambda e, a: None).__code__",
        "m = sys.modules['__main__']; m._FILE = m._PROC = m._NET = ()",
        "os.remove(inputs['p'])",
        "os.truncate(inputs['p'], 0)",
        "import socket; socket.create_connection(('127.0.0.1', inputs['port']), timeout=1)",
        "import subprocess; subprocess.run(['/bin/sh', '-c', 'rm ' + inputs['p']])",
        "os.fork() == 0 and os._exit(0)",
    ), {"p": str(victim), "port": port}, isolation=mode)
    assert r.ok and 0 not in r.value and not {2, 3, 4, 5, 6} & set(r.value), r
    assert victim.read_text() == "precious"


@needs_bwrap
@pytest.mark.parametrize("mode", MODES)
def test_attack_2_routes_around_the_hook(mode, victim):
    fork_exec = ("import _posixsubprocess; r, w = os.pipe(); _posixsubprocess.fork_exec("
                 "[b'/bin/sh', b'-c', b'rm ' + inputs['p'].encode()], [b'/bin/sh'], True, (), "
                 "None, None, -1, -1, -1, -1, -1, -1, r, w, False, False, -1, None, None, None, "
                 "-1, None, False); import time; time.sleep(0.5)")
    sub = ("import _xxsubinterpreters as X; X.run_string(X.create(), "
           "'import os; os.unlink(' + repr(inputs['p']) + ')')")
    ctypes_by_another_name = (
        "import importlib.util, glob, sysconfig; d = sysconfig.get_paths()['stdlib']; "
        "s = importlib.util.spec_from_file_location('_ctypes', "
        "glob.glob(d + '/lib-dynload/_ctypes*.so')[0]); m = importlib.util.module_from_spec(s); "
        "s.loader.exec_module(m); sys.modules['_ctypes'] = m; "
        "s = importlib.util.spec_from_file_location('notctypes', d + '/ctypes/__init__.py'); "
        "c = importlib.util.module_from_spec(s); s.loader.exec_module(c); "
        "assert c.CDLL(None).unlink(inputs['p'].encode()) == 0")
    with no_process_left():
        r = run_python(attempts(fork_exec, sub, ctypes_by_another_name), {"p": str(victim)},
                       isolation=mode)
    assert r.ok and r.value == [], r
    assert victim.read_text() == "precious"


@needs_bwrap
@pytest.mark.parametrize("mode", MODES)
def test_attack_3_signals_to_the_caller(mode, sentinel):
    r = run_python(attempts("os.kill(os.getppid(), 9)", "os.killpg(os.getpgid(0), 9)",
                            "os.kill(inputs['caller'], 9)", "os.killpg(inputs['group'], 9)",
                            "import signal; signal.pthread_kill(1, 9)"),
                   {"caller": os.getpid(), "group": os.getpgid(0)}, isolation=mode)
    assert r.ok and r.value == [], r  # and this test (the caller) and its group are alive


@needs_bwrap
@pytest.mark.parametrize("mode", MODES)
def test_attack_4_writes_past_the_access_mode(mode, victim, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    mtime, xattrs = victim.stat().st_mtime_ns, os.listxattr(victim)
    new = tmp_path / "created.txt"
    r = run_python(attempts(
        "os.open(inputs['p'], os.O_RDONLY | os.O_TRUNC)",
        "os.open(inputs['new'], os.O_RDONLY | os.O_CREAT)",
        "import sqlite3; sqlite3.connect('x.db').execute('create table t (x)')",
        "import sqlite3; sqlite3.connect(inputs['db']).execute('create table t (x)')",
        "os.mkfifo(inputs['fifo'])",
        "os.mknod(inputs['node'])",
        "os.utime(inputs['p'], (0, 0))",
        "os.setxattr(inputs['p'], 'user.x', b'1')",
    ), {"p": str(victim), "new": str(new), "db": str(tmp_path / "y.db"),
        "fifo": str(tmp_path / "fifo"), "node": str(tmp_path / "node")}, isolation=mode)
    assert r.ok and r.value == [], r
    assert victim.read_text() == "precious" and victim.stat().st_mtime_ns == mtime
    assert os.listxattr(victim) == xattrs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["victim.txt"]


@pytest.mark.parametrize("mode", MODES)
def test_attack_5_an_unbounded_stderr_loop_is_capped(mode):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    r = run_python("import sys\nwhile True:\n    sys.stderr.write('debug ' * 1000)", cpu_s=1,
                   wall_s=60, isolation=mode)
    assert r.reason == "output_limit" and "1000000 bytes" in r.error
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mb < 50, grown_mb  # was about 900 MB before the cap
    assert len(r.stderr) == 2000


@pytest.mark.parametrize("mode", MODES)
def test_attack_6_invalid_utf8_and_deep_results_do_not_raise(mode):
    r = run_python("import os\nos.write(1, b'\\xff\\xfe ok')\nos.write(2, b'\\xc3')\n"
                   "result = 1", isolation=mode)
    assert r.ok and r.value == 1 and r.stdout == "\ufffd\ufffd ok" and r.stderr == "\ufffd"
    r = run_python("x = []\nfor _ in range(100000):\n    x = [x]\nresult = x", isolation=mode)
    assert r.reason == "bad_result" and "RecursionError" in r.error
    r = run_python("x = []\nfor _ in range(150):\n    x = [x]\nresult = x", isolation=mode)
    assert r.reason == "bad_result" and "deeper than 100" in r.error


@needs_bwrap
@pytest.mark.parametrize("mode", MODES)
def test_attack_7_the_reply_cannot_be_forged(mode):
    forged = '{"reason": "ok", "value": 42}'
    r = run_python(f"import sys, os\nsys.__stdout__.write({forged!r} + '\\n')\n"
                   "sys.__stdout__.flush()\nos._exit(0)", isolation=mode)
    assert r.stdout == forged + "\n"
    assert not r.ok and r.value is None and r.reason == "crash", r
    # every descriptor it holds: a forged verdict, an unknown reason, a bottomless message
    for forged in ('{"reason": "ok", "value": 42}', '{"kind": "pwned"}', "[" * 100_000):
        r = run_python("import os\nfor fd in range(3, 64):\n    try:\n"
                       f"        os.write(fd, {forged!r}.encode())\n"
                       "    except OSError:\n        pass\nos._exit(0)", isolation=mode)
        assert not r.ok and r.value is None and r.reason in ("bad_result", "crash"), r
    r = run_python("result = 42\nraise SystemExit(0)", isolation=mode)
    assert r.reason == "error"  # only the harness, after the program, reports ok


@needs_bwrap
def test_attack_8_no_environment_no_caller_memory_and_real_limits(monkeypatch):
    monkeypatch.setenv("AGENTRL_SECRET", "hunter2")
    r = run_python(attempts(
        "secret = dict(os.environ)",
        "open(f'/proc/{os.getppid()}/mem', 'rb').read(1)",
        "open(f\"/proc/{inputs['caller']}/mem\", 'rb').read(1)",
        "open('/proc/self/environ', 'rb').read()",
    ) + "\nresult = [done, secret, [__import__('resource').getrlimit(getattr("
        "__import__('resource'), n)) for n in ('RLIMIT_NPROC', 'RLIMIT_NOFILE')]]",
        {"caller": os.getpid()})
    assert r.ok, r
    done, env, limits = r.value
    assert done == [0] and "hunter2" not in str(env) and "AGENTRL" not in str(env)
    assert limits == [[16, 16], [64, 64]]
    r = run_python("import os\nfds = [os.open('/dev/null', os.O_RDONLY) for _ in range(100)]")
    assert r.reason == "error" and "Too many open files" in r.error


@needs_bwrap
@pytest.mark.parametrize("mode", MODES)
def test_attack_9_no_grandchild_outlives_the_run(mode):
    spawn = ("import _posixsubprocess; r, w = os.pipe(); _posixsubprocess.fork_exec("
             "[b'/bin/sleep', b'30'], [b'/bin/sleep'], True, (), None, None, -1, -1, -1, -1, "
             "-1, -1, r, w, False, True, -1, None, None, None, -1, None, False)")
    fork = "pid = os.fork()\n    if pid == 0:\n        os.setsid(); import time; time.sleep(30)"
    with no_process_left():  # a finished program whose grandchild still ran lost its result
        r = run_python(attempts(spawn, fork, "import threading, time; threading.Thread("
                                "target=time.sleep, args=(30,)).start()"), isolation=mode)
    assert r.ok and r.value == [2], r  # only the thread started, and it died with the program
    with no_process_left():
        r = run_python(attempts(spawn, fork) + "\nimport time\ntime.sleep(30)", wall_s=1,
                       isolation=mode)
    assert r.reason == "wall_time"


# ---- more: reading outside, writing under /work, fork bombs, the network ----

@needs_bwrap
def test_files_outside_the_sandbox_are_not_there():
    paths = [__file__, str(REPO / "agentrl_lib" / "envs" / "sandbox.py"), "/etc/shadow",
             "/etc/passwd", "/etc/hostname", str(Path.home() / ".bashrc"),
             os.environ.get("HF_HOME", str(Path.home() / ".cache" / "huggingface")),
             str(Path(sys.executable).parent.parent / "pyvenv.cfg"), "/work"]
    r = run_python("import os\nresult = [[p, os.path.exists(p)] for p in inputs['paths']]\n"
                   "result.append(sorted(os.listdir('/')))", {"paths": paths})
    assert r.ok and not any(seen for _, seen in r.value[:-1]), r
    top = {"dev", "lib", "lib64", "tmp", "usr"} | {p.split("/")[1] for p in sandbox._interpreter()}
    assert r.value[-1] == sorted(top)


@needs_bwrap
@pytest.mark.parametrize("mode", MODES)
def test_nothing_is_written_under_the_project(mode):
    mine = REPO / f".sandbox_victim_{os.getpid()}_{mode}"
    mine.write_text("precious")
    try:
        r = run_python(attempts("open(inputs['p'], 'w').write('x')", "os.unlink(inputs['p'])",
                                "open(inputs['new'], 'x')"),
                       {"p": str(mine), "new": str(REPO / f".sandbox_new_{os.getpid()}")},
                       isolation=mode)
        assert r.ok and r.value == [], r
        assert mine.read_text() == "precious"
        assert not (REPO / f".sandbox_new_{os.getpid()}").exists()
    finally:
        mine.unlink()


@needs_bwrap
@pytest.mark.parametrize("mode", MODES)
def test_fork_and_thread_bombs_are_contained(mode):
    with no_process_left():
        r = run_python("import os\nwhile True:\n    os.fork()", isolation=mode)
        assert r.reason == "process"
        r = run_python("import _posixsubprocess\n", isolation=mode)
        assert r.reason == "process"
        r = run_python("import threading, time\nwhile True:\n"
                       "    threading.Thread(target=time.sleep, args=(30,)).start()",
                       isolation=mode, memory_mb=256)
    assert r.reason in ("error", "memory") and not r.ok, r


@needs_bwrap
@pytest.mark.parametrize("mode", MODES)
def test_no_connection_reaches_a_listener_of_the_caller(mode, listener):
    port = listener.getsockname()[1]
    r = run_python(attempts(
        "import socket; socket.create_connection(('127.0.0.1', inputs['port']), timeout=1)",
        "import _socket; s = _socket.socket(); s.connect(('127.0.0.1', inputs['port']))",
        "import urllib.request; urllib.request.urlopen(f\"http://127.0.0.1:{inputs['port']}\")",
    ), {"port": port}, isolation=mode)
    assert r.ok and r.value == [], r


# ---- each layer alone: with the others taken out of the harness, the attacks are still contained

NO_HOOK = ('sys.addaudithook(type(_hook)(_hook.__code__, own, "_hook"))', "pass")
NO_FILTER = ("prog = _seccomp_program(os.getpid())", "prog = None")


@needs_bwrap
@pytest.mark.parametrize("mode,removed", [
    ("bwrap", [NO_HOOK]),  # namespaces + filter
    ("bwrap", [NO_HOOK, NO_FILTER]),  # namespaces alone
    pytest.param("hook", [NO_HOOK], marks=pytest.mark.skipif(not X86, reason="x86-64 filter")),
])
def test_each_layer_alone_contains_the_attacks(mode, removed, monkeypatch, victim, listener,
                                               sentinel):
    harness = sandbox._HARNESS
    for old, new in removed:
        assert harness.count(old) == 1, old  # the harness changed: update this test
        harness = harness.replace(old, new)
    monkeypatch.setattr(sandbox, "_HARNESS", harness)
    with no_process_left():
        r = run_python(attempts(
            "os.remove(inputs['p'])", "os.truncate(inputs['p'], 0)",
            "open(inputs['p'], 'w').write('x')",
            "os.open(inputs['p'], os.O_RDONLY | os.O_TRUNC)",
            "import socket; socket.create_connection(('127.0.0.1', inputs['port']), timeout=1)",
            "os.kill(inputs['caller'], 9)", "os.killpg(inputs['group'], 9)",
            "pid = os.fork()\n    if pid == 0:\n        os.setsid(); import time; time.sleep(30)",
            "import ctypes; assert ctypes.CDLL(None).unlink(inputs['p'].encode()) == 0",
            "sys.modules['__main__']._hook.__code__ = (lambda e, a: None).__code__",
            "import _posixsubprocess; r, w = os.pipe(); _posixsubprocess.fork_exec([b'/bin/sh', "
            "b'-c', b'rm ' + inputs['p'].encode()], [b'/bin/sh'], True, (), None, None, -1, -1, "
            "-1, -1, -1, -1, r, w, False, False, -1, None, None, None, -1, None, False); "
            "import time; time.sleep(0.5)",
        ), {"p": str(victim), "port": listener.getsockname()[1], "caller": os.getpid(),
            "group": os.getpgid(0)}, isolation=mode)
    assert r.ok, r
    if [NO_HOOK] == removed:  # the hook is gone, so each refusal here is the filter's
        assert r.value == [9], r  # only replacing a function's code went through
    assert victim.read_text() == "precious"


# ---- where bwrap is missing ----

def test_missing_bwrap_refuses_untrusted_code_and_opts_into_the_hook(monkeypatch):
    monkeypatch.setattr(sandbox, "BWRAP", "/nonexistent/bwrap")
    monkeypatch.setattr(sandbox, "_warned", False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        r = run_python("result = 1")
        r2 = run_python("result = 2")
    assert [str(w.message).count("/nonexistent/bwrap") for w in caught] == [1]  # said once
    for res in (r, r2):
        assert not res.ok and res.reason == "no_isolation" and "bubblewrap" in res.error
        assert res.value is None
    r = run_python("result = 3", isolation="bwrap_or_hook")
    assert r.ok and r.value == 3 and r.isolation == "hook"
    # the project's stack-language judge keeps working there
    from agentrl_lib.envs.program_synth import ProgramSynthTask
    T = ProgramSynthTask()
    t = T.task(0)
    assert T.evaluate(t["reference"], t["tests"])["pass_rate"] == 1.0
