"""A sandbox for model-written programs: each run is a fresh Python process in its own Linux
namespaces (bubblewrap), under a syscall filter, CPU, memory, file and process limits, with a
wall clock and a cap on its output, so an infinite loop, a memory bomb, a fork bomb, a socket, a
write outside, a signal to the caller or a forged reply ends as a failed run with its reason,
never as a hung, crashed or altered caller.

``run_python(code, inputs)`` runs ``code`` (Python source that reads ``inputs``, a dict, and sets
``result``, JSON-serialisable) and returns a ``SandboxResult``: ``ok``, ``value``, ``reason``
(one of ``REASONS``), ``error`` (a one-line message), ``stdout``/``stderr`` (the last 2000
characters of what the program printed) and ``isolation`` ('bwrap' or 'hook'). It never raises
for anything the program does; bad arguments raise a one-line ValueError naming the argument.

**Layers** (``isolation='bwrap'``, the default):

1. bubblewrap (``bwrap``, https://github.com/containers/bubblewrap, the sandbox Flatpak uses)
   starts the interpreter with ``--unshare-all --unshare-user``: no network (a new network
   namespace holding only its own loopback), new PID, IPC, UTS (and cgroup) namespaces, user 65534
   with no capabilities (``--cap-drop ALL``, ``--disable-userns``), ``--new-session``,
   ``--die-with-parent``, ``--clearenv`` (and bwrap itself starts with an empty environment).
   Its file system is an empty root holding, read-only, only the interpreter binary, its
   standard library (``site-packages`` hidden) and the shared libraries ``ldd`` names for them;
   no ``/proc``, nothing of the project, ``/work``, the home folder or the model cache; a
   private ``/tmp`` tmpfs (``tmpfs_bytes``, the working folder). When the program's process ends,
   bwrap's PID 1 ends and the kernel kills every process left in the namespace.
2. Inside, a small supervisor (trusted code, run before any of the program's) forks the process
   that runs the program. That process sets ``RLIMIT_CPU`` (``cpu_s``, rounded up: SIGXCPU),
   ``RLIMIT_AS`` (``memory_mb``: MemoryError), ``RLIMIT_FSIZE`` 0, ``RLIMIT_CORE`` 0,
   ``RLIMIT_NOFILE`` 64 and ``RLIMIT_NPROC`` 16 (each read back: a limit that did not take is a
   crash, never a silent pass), ``PR_SET_PDEATHSIG``, and (x86-64) a seccomp filter that denies
   fork, exec, ptrace, sockets, signals to other processes, namespaces, mounts, io_uring, and
   every syscall that creates, deletes, renames, truncates or changes files, or opens one for
   writing. ``RLIMIT_NPROC`` is not enforced by the kernel where the caller is root (the
   sandbox's user maps to root outside); the filter is what stops a fork bomb there.
3. A PEP 578 audit hook (the module's first guard, kept as a second line behind the two
   above, and the source of most reasons): it refuses sockets and network modules
   (``network``), opening for writing (any of O_WRONLY, O_RDWR, O_CREAT, O_TRUNC, O_APPEND),
   deleting, renaming, ``utime``, xattrs and sqlite files (``file_write``), processes, signals,
   ctypes (under any name), subinterpreters, ``gc`` walks and replacing a function's code
   (``process``). Alone it is no boundary (issue 29 went around it four ways).

**The reply.** The program's process sends its ``result`` on a pipe of its own to the supervisor;
the supervisor reads it (capped), waits for the process, decides the reason from its exit
status (a signal of the CPU limit is ``cpu_time``, whatever the program wrote) and writes the
verdict on a file descriptor the program's process closed before its first line ran. The
caller reads stdout, stderr and that descriptor incrementally: past ``max_output_bytes`` of
output the run is killed (``output_limit``), past ``wall_s`` it is killed (``wall_time``);
invalid UTF-8 is replaced, a result nested deeper than ``MAX_DEPTH`` is ``bad_result``, a reason
outside ``REASONS`` cannot pass. The program still chooses its own ``result`` (that is the API):
a caller judging a program must run the judge's tests outside it or after it in a separate run.

**Without bwrap** (a laptop without the package, or user namespaces turned off), the first call
warns once and untrusted code is refused (``no_isolation``) unless the caller passes
``isolation='bwrap_or_hook'`` (bwrap where it works, else the weaker mode) or ``'hook'``
(always the weaker mode). The weaker mode is layers 2 and 3 only, run as the caller's user in
its file system: reads of any file the caller can read are possible, and the filter covers
x86-64 only. It is meant for the project's own code, such as the stack-language interpreter of
``program_synth`` (the model's program is data to it), never for model-written Python.

What it is not: a boundary against kernel exploits (bwrap and seccomp rely on the kernel), nor
against side channels or reading the interpreter's own files. The run's cost is measured in
``reproductions/benchmarks/sandbox_isolation.py``. Linux only.
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import selectors
import signal
import subprocess
import sys
import sysconfig
import time
import warnings
from dataclasses import dataclass

REASONS = ("ok", "error", "cpu_time", "wall_time", "memory", "network", "file_write", "process",
           "crash", "bad_result", "output_limit", "no_isolation")
ISOLATIONS = ("bwrap", "bwrap_or_hook", "hook")
BWRAP = "/usr/bin/bwrap"  # tests point it at a missing file to check the refusal
MAX_DEPTH = 100  # deepest nesting of a result (lists and dicts)
MAX_RESULT_BYTES = 16 * 1024 * 1024
_TAIL = 2000
_warned = False

# The supervisor and the program's process. Kept as source so the sandbox imports nothing of
# this package (python -I -S -B: no site-packages, no environment, no bytecode written).
_HARNESS = r'''
import json, os, resource, select, signal, sys
import ctypes

spec = json.loads(sys.stdin.buffer.read().decode("utf-8"))
REPLY = spec["reply_fd"]
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: the supervisor dies with the caller
DENY = {57, 58, 59, 322, 101, 310, 311, 129, 297, 434, 424, 438, 41, 53, 272, 308, 165, 166, 155,
        161, 133, 259, 85, 87, 263, 82, 264, 316, 84, 83, 258, 76, 77, 86, 265, 88, 266, 90, 91,
        268, 452, 92, 93, 94, 260, 132, 235, 280, 261, 188, 189, 190, 197, 198, 199, 437, 298, 321,
        323, 425, 426, 427, 250, 248, 249, 312, 303, 304, 463, 466, 428, 429, 430, 431, 432, 433,
        442, 300, 169, 175, 313, 176, 246, 320, 163, 167, 168, 170, 171, 179}  # x86-64 numbers
# O_WRONLY, O_RDWR, O_CREAT, O_TRUNC, O_APPEND, O_TMPFILE: any of them opens for writing
WRITE_FLAGS = 0o1 | 0o2 | 0o100 | 0o1000 | 0o2000 | 0o20000000


def _seccomp_program(pid):
    """The classic-BPF filter (seccomp(2)): x86-64 only; None elsewhere."""
    import platform
    if platform.machine() != "x86_64" or sys.byteorder != "little":
        return None
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, kill = 0x7FFF0000, 0x80000000
    eperm, enosys = 0x00050000 | 1, 0x00050000 | 38
    arg = lambda i: 16 + 8 * i  # low 32 bits of args[i] (little-endian)
    prog, fix = [], []  # fix: (index, true label, false label) resolved below

    def op(code, k, jt=None, jf=None):
        prog.append([code, 0, 0, k])
        if jt is not None or jf is not None:
            fix.append((len(prog) - 1, jt, jf))

    op(ld, 4)
    op(jeq, 0xC000003E, None, "KILL")  # AUDIT_ARCH_X86_64
    op(ld, 0)
    op(jge, 0x40000000, "EPERM", None)  # the x32 ABI
    op(jeq, 435, "ENOSYS", None)  # clone3: glibc falls back to clone for threads
    op(jeq, 56, "CLONE", None)
    for nr in (62, 200, 234):  # kill, tkill, tgkill: only to itself
        op(jeq, nr, "SELF", None)
    op(jeq, 2, "OPEN1", None)
    op(jeq, 257, "OPEN2", None)
    for nr in sorted(DENY):
        op(jeq, nr, "EPERM", None)
    labels = {}
    op(ret, allow)
    labels["CLONE"] = len(prog)
    op(ld, arg(0))
    op(jset, 0x00010000, "ALLOW", "EPERM")  # CLONE_THREAD: threads only
    labels["SELF"] = len(prog)
    op(ld, arg(0))
    op(jeq, pid, "ALLOW", "EPERM")
    labels["OPEN1"] = len(prog)
    op(ld, arg(1))
    op(jset, WRITE_FLAGS, "EPERM", "ALLOW")
    labels["OPEN2"] = len(prog)
    op(ld, arg(2))
    op(jset, WRITE_FLAGS, "EPERM", "ALLOW")
    for name, value in (("ALLOW", allow), ("EPERM", eperm), ("ENOSYS", enosys), ("KILL", kill)):
        labels[name] = len(prog)
        op(ret, value)
    for i, jt, jf in fix:
        prog[i][1] = 0 if jt is None else labels[jt] - i - 1
        prog[i][2] = 0 if jf is None else labels[jf] - i - 1
    assert all(0 <= p[1] < 256 and 0 <= p[2] < 256 for p in prog)
    return prog


def _confine(spec):
    """Limits, then the syscall filter; returns [what could not be set]."""
    failed = []
    cpu = max(1, int(-(-float(spec["cpu_s"]) // 1)))
    mem = int(spec["memory_mb"]) * 1024 * 1024
    for name, soft, hard in (("RLIMIT_CPU", cpu, cpu + 1), ("RLIMIT_AS", mem, mem),
                             ("RLIMIT_FSIZE", 0, 0), ("RLIMIT_CORE", 0, 0),
                             ("RLIMIT_NOFILE", 64, 64), ("RLIMIT_NPROC", 16, 16)):
        try:
            resource.setrlimit(getattr(resource, name), (soft, hard))
            if resource.getrlimit(getattr(resource, name)) != (soft, hard):
                failed.append(name)
        except (ValueError, OSError) as err:
            failed.append(f"{name} ({err})")
    libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: dies with the supervisor
    prog = _seccomp_program(os.getpid())
    if prog is None:
        return failed, "off (not x86-64)"

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                    ("k", ctypes.c_uint)]

    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    table = (Filter * len(prog))(*[Filter(*p) for p in prog])
    fprog = Fprog(len(prog), table)
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
        failed.append(f"PR_SET_NO_NEW_PRIVS (errno {ctypes.get_errno()})")
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong,
                           ctypes.c_ulong]
    if libc.prctl(22, 2, ctypes.addressof(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, FILTER
        failed.append(f"seccomp (errno {ctypes.get_errno()})")
    return failed, "on"


class Refused(PermissionError):
    pass


def _hook(event, args):
    # the lists are this function's constants: replacing its code is refused below
    if event.startswith(("socket.", "http.", "urllib.", "ftplib.", "smtplib.", "telnetlib.",
                         "imaplib.", "poplib.", "nntplib.", "webbrowser.")):
        raise Refused(f"network: {event} is not allowed in the sandbox")
    if event.startswith(("subprocess.Popen", "os.system", "os.exec", "os.fork", "os.forkpty",
                         "os.posix_spawn", "os.spawn", "os.startfile", "pty.spawn", "os.kill",
                         "os.killpg", "signal.pthread_kill", "ctypes.", "gc.get_",
                         "cpython.PyInterpreterState_New", "cpython._PySys_ClearAuditHooks")):
        raise Refused(f"process: {event} is not allowed in the sandbox")
    if event == "object.__setattr__" and len(args) > 1 and args[1] in (
            "__code__", "__defaults__", "__kwdefaults__", "__closure__", "__globals__"):
        raise Refused(f"process: setting {args[1]} is not allowed in the sandbox")
    if event.startswith(("os.remove", "os.unlink", "os.rename", "os.rmdir", "os.mkdir",
                         "os.truncate", "os.chmod", "os.chown", "os.link", "os.symlink",
                         "os.utime", "os.setxattr", "os.removexattr", "os.chflags", "os.lockf",
                         "shutil.")):
        raise Refused(f"file_write: {event} is not allowed in the sandbox")
    if event == "sqlite3.connect" and (not args or args[0] != ":memory:"):
        raise Refused("file_write: sqlite3 databases other than ':memory:' are not allowed")
    if event == "open":
        path, mode, flags = (list(args) + [None, None, None])[:3]
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & 0o20003103 != 0)  # WRITE_FLAGS (a constant here)
        if writing:
            raise Refused(f"file_write: opening {path!r} for writing is not allowed in the sandbox")
    if event == "import" and args:
        what = " ".join(str(a) for a in args[:2])
        for bad in ("ctypes", "_posixsubprocess", "_xxsubinterpreters", "_xxinterpchannels",
                    "_testcapi", "_testinternalcapi", "_posixshmem"):
            if bad in what:
                raise Refused(f"process: importing {bad} is not allowed in the sandbox")


def _program(spec, w):
    """The program's process: never returns."""
    os.close(REPLY)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    failed, filt = _confine(spec)
    if failed:
        _send(w, {"kind": "crash", "error": "could not set " + ", ".join(failed)})
        os._exit(0)
    for name in [m for m in sys.modules if "ctypes" in m]:
        del sys.modules[name]
    g = globals()
    for name in ("ctypes", "libc", "_confine", "_seccomp_program"):
        g.pop(name, None)
    code, inputs = spec.pop("code"), spec.pop("inputs")
    sys.dont_write_bytecode = True
    # the hook gets globals of its own: rebinding names in __main__ or builtins cannot change it
    own = {"__builtins__": {"isinstance": isinstance, "list": list, "any": any, "str": str,
                            "len": len, "int": int}, "Refused": Refused}
    sys.addaudithook(type(_hook)(_hook.__code__, own, "_hook"))
    scope = {"inputs": inputs, "__name__": "__sandbox__"}
    try:
        exec(compile(code, "<program>", "exec"), scope)
        try:
            msg = {"kind": "value", "value": scope.get("result")}
            text = json.dumps(msg)
        except (TypeError, ValueError, RecursionError) as err:
            text = json.dumps({"kind": "bad_result",
                               "error": f"result is not JSON: {type(err).__name__}: {err}"[:300]})
    except MemoryError:
        text = json.dumps({"kind": "memory", "error": "memory limit reached (MemoryError)"})
    except Refused as err:
        text = json.dumps({"kind": str(err).split(":", 1)[0], "error": str(err)[:300]})
    except BaseException as err:  # noqa: BLE001 - the program's own failure, reported
        text = json.dumps({"kind": "error", "error": f"{type(err).__name__}: {err}"[:300]})
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except BaseException:  # noqa: BLE001
            pass
    _send(w, text)
    os._exit(0)


def _send(w, msg):
    data = (msg if isinstance(msg, str) else json.dumps(msg)).encode()
    while data:
        data = data[os.write(w, data):]


def _depth(value):
    deepest, todo = 0, [(value, 1)]
    while todo:
        v, d = todo.pop()
        deepest = max(deepest, d)
        if deepest > spec["max_depth"]:
            return deepest
        if isinstance(v, dict):
            todo.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            todo.extend((x, d + 1) for x in v)
    return deepest


def _judge(status, data):
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig in (signal.SIGXCPU, signal.SIGKILL):
            return {"reason": "cpu_time", "error": "CPU-time limit reached (killed by the kernel)"}
        if sig == signal.SIGXFSZ:
            return {"reason": "file_write", "error": "file size limit reached (SIGXFSZ)"}
        return {"reason": "crash", "error": f"the program's process was killed by "
                                            f"{signal.Signals(sig).name}"}
    code = os.WEXITSTATUS(status)
    if code != 0 or not data:
        return {"reason": "crash", "error": f"the program's process ended with code {code} "
                                            f"without a result"}
    if len(data) > spec["max_result_bytes"]:
        return {"reason": "bad_result", "error": f"result over {spec['max_result_bytes']} bytes"}
    try:
        msg = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as err:
        return {"reason": "bad_result", "error": f"unreadable result: {type(err).__name__}"}
    kinds = {"value": "ok", "error": "error", "memory": "memory", "bad_result": "bad_result",
             "network": "network", "file_write": "file_write", "process": "process",
             "crash": "crash"}
    if not isinstance(msg, dict) or msg.get("kind") not in kinds:
        return {"reason": "bad_result", "error": "malformed result message"}
    if msg["kind"] != "value":
        return {"reason": kinds[msg["kind"]], "error": str(msg.get("error"))[:300]}
    if _depth(msg.get("value")) > spec["max_depth"]:
        return {"reason": "bad_result", "error": f"result nested deeper than {spec['max_depth']}"}
    return {"reason": "ok", "value": msg.get("value")}


r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    _program(spec, w)
os.close(w)
os.set_blocking(r, False)
chunks, size, status = [], 0, None


def _drain():
    """Read what the pipe holds; True at its end."""
    global size
    while True:
        try:
            block = os.read(r, 1 << 16)
        except BlockingIOError:
            return False
        if not block:
            return True
        if size <= spec["max_result_bytes"]:
            chunks.append(block)
        size += len(block)


while status is None:  # until the program's process ends, not the pipe: a grandchild may hold it
    select.select([r], [], [], 0.05)
    if _drain():
        _, status = os.waitpid(pid, 0)
    else:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = st
            _drain()
try:
    verdict = _judge(status, b"".join(chunks))
    text = json.dumps(verdict)
except BaseException as err:  # noqa: BLE001 - never leave the caller without a verdict
    text = json.dumps({"reason": "bad_result", "error": f"{type(err).__name__}"})
_send(REPLY, text)
os._exit(0)
'''


@dataclass
class SandboxResult:
    ok: bool
    value: object = None
    reason: str = "ok"
    error: str | None = None
    stdout: str = ""  # the program's own prints (the last 2000 characters)
    stderr: str = ""
    isolation: str = ""  # 'bwrap' or 'hook' ('' when refused)

    def __bool__(self) -> bool:
        return self.ok


def run_python(code: str, inputs: dict | None = None, cpu_s: float = 1.0, memory_mb: int = 256,
               wall_s: float | None = None, max_output_bytes: int = 1_000_000,
               isolation: str = "bwrap", tmpfs_bytes: int = 16 * 1024 * 1024) -> SandboxResult:
    """Run ``code`` (Python source that reads ``inputs`` and sets ``result``) in a fresh sandboxed
    process (module docstring) and return its ``SandboxResult``; never raises for anything the
    program does. ``isolation``: 'bwrap' (refuse without it), 'bwrap_or_hook', 'hook' (the
    weaker mode: trusted code only). ``wall_s`` defaults to 2 x cpu_s + 2 s (a sleeper uses no
    CPU). Bad arguments raise a one-line ValueError naming the argument."""
    _check_number("cpu_s", cpu_s, "> 0", lambda v: v > 0)
    _check_number("memory_mb", memory_mb, ">= 32 (the interpreter itself needs ~10 MB)",
                  lambda v: v >= 32)
    wall = 2.0 * float(cpu_s) + 2.0
    if wall_s is not None:
        wall = _check_number("wall_s", wall_s, "> 0", lambda v: v > 0)
    _check_number("max_output_bytes", max_output_bytes, ">= 1", lambda v: v >= 1)
    _check_number("tmpfs_bytes", tmpfs_bytes, ">= 4096", lambda v: v >= 4096)
    if not isinstance(code, str):
        raise ValueError(f"code must be a string of Python source, got {type(code).__name__}")
    if isolation not in ISOLATIONS:
        raise ValueError(f"isolation must be one of {ISOLATIONS}, got {isolation!r}")
    use = "hook" if isolation == "hook" else ("bwrap" if bwrap_problem() is None else None)
    if use is None and isolation == "bwrap_or_hook":
        use = "hook"
    if use is None:
        return SandboxResult(False, reason="no_isolation", error=(
            f"untrusted code refused: {bwrap_problem()}; install bubblewrap (apt-get install "
            f"bubblewrap) or pass isolation='bwrap_or_hook' for trusted code"))
    try:
        json.dumps(inputs or {})
    except (TypeError, ValueError, RecursionError) as err:
        raise ValueError(f"inputs must be JSON-serialisable: {err}") from err
    spec = {"code": code, "inputs": inputs or {}, "cpu_s": float(cpu_s),
            "memory_mb": int(memory_mb), "max_depth": MAX_DEPTH,
            "max_result_bytes": MAX_RESULT_BYTES}
    return _run(spec, use, wall, int(max_output_bytes), int(tmpfs_bytes))


def _check_number(name, value, rule, holds):
    """``value`` as a float when it is a finite number for which ``holds`` (its rule), else a
    one-line ValueError naming the argument."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or not holds(value):
        raise ValueError(f"{name} must be a finite number {rule}, got {value!r}")
    return float(value)


def _interpreter():
    """(the interpreter's real path, its stdlib folder) that the sandbox runs."""
    return os.path.realpath(sys.executable), os.path.realpath(sysconfig.get_paths()["stdlib"])


@functools.lru_cache(maxsize=4)
def _bwrap_args(bwrap: str) -> tuple:
    """bwrap's arguments up to the command: namespaces, then read-only binds of only the
    interpreter, its stdlib and the shared libraries ldd names for them (module docstring)."""
    exe, stdlib = _interpreter()
    dynload = os.path.join(stdlib, "lib-dynload")
    sos = sorted(os.path.join(dynload, f) for f in os.listdir(dynload)) if os.path.isdir(
        dynload) else []
    out = subprocess.run(["ldd", exe, *sos], capture_output=True, text=True, env={},
                         check=False).stdout
    libs = set(re.findall(r"=> (/\S+)", out)) | set(re.findall(r"^\s+(/\S+) \(", out, re.M))
    links, binds = {}, {exe, stdlib}
    for lib in sorted(libs):
        if os.path.exists(lib):
            binds.add(_resolve(lib, links))
    binds = sorted(b for b in binds if not any(b.startswith(o + "/") for o in binds))
    args = [bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session",
            "--clearenv", "--cap-drop", "ALL", "--disable-userns", "--uid", "65534",
            "--gid", "65534"]
    for b in binds:
        args += ["--ro-bind", b, b]
    if os.path.isdir(os.path.join(stdlib, "site-packages")):
        args += ["--tmpfs", os.path.join(stdlib, "site-packages")]
    for link, target in sorted(links.items()):
        if not any(link.startswith(b + "/") for b in binds):
            args += ["--symlink", target, link]
    return tuple(args + ["--dev", "/dev"])


def _resolve(path: str, links: dict) -> str:
    """The real path of ``path``, recording each symlink met on the way in ``links``."""
    parts, cur = path.strip("/").split("/"), ""
    for i, part in enumerate(parts):
        nxt = f"{cur}/{part}"
        if os.path.islink(nxt):
            target = os.readlink(nxt)
            links[nxt] = target
            base = target if target.startswith("/") else os.path.join(cur or "/", target)
            return _resolve(os.path.normpath(os.path.join(base, *parts[i + 1:])), links)
        cur = nxt
    return cur


@functools.lru_cache(maxsize=4)
def _probe(bwrap: str) -> str | None:
    if not os.path.isfile(bwrap) or not os.access(bwrap, os.X_OK):
        return f"bubblewrap (bwrap) not found at {bwrap}"
    try:
        cmd = list(_bwrap_args(bwrap)) + [_interpreter()[0], "-I", "-S", "-c", "pass"]
        proc = subprocess.run(cmd, capture_output=True, env={}, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError) as err:
        return f"bwrap at {bwrap} cannot start: {err}"
    if proc.returncode != 0:
        tail = proc.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no output"]
        return f"bwrap at {bwrap} does not work here: {tail[0][:200]}"
    return None


def bwrap_problem() -> str | None:
    """None when bwrap works here, else why not (warned about once per process)."""
    global _warned
    problem = _probe(BWRAP)
    if problem is not None and not _warned:
        _warned = True
        warnings.warn(f"sandbox: {problem}; untrusted code will be refused (isolation='bwrap') "
                      f"and trusted code runs in the weaker hook mode", RuntimeWarning,
                      stacklevel=3)
    return problem


def _run(spec: dict, use: str, wall: float, max_out: int, tmpfs: int) -> SandboxResult:
    exe = _interpreter()[0]
    py = [exe, "-I", "-S", "-B", "-X", "utf8", "-c", _HARNESS]
    r_reply, w_reply = os.pipe()
    data = json.dumps({**spec, "reply_fd": w_reply}).encode("utf-8")
    if use == "bwrap":
        cmd = list(_bwrap_args(BWRAP)) + ["--size", str(tmpfs), "--tmpfs", "/tmp", "--chdir",
                                          "/tmp", "--remount-ro", "/", *py]
    else:
        cmd = py
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, pass_fds=(w_reply,), env={}, cwd="/",
                                start_new_session=True)
    finally:
        os.close(w_reply)
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except OSError:  # the sandbox died before reading its spec: its status says why
        pass
    bufs, why = _collect(proc, r_reply, wall, max_out)
    os.close(r_reply)
    out, err = (bufs[k].decode("utf-8", "replace")[-_TAIL:] for k in ("out", "err"))
    res = SandboxResult(False, stdout=out, stderr=err, isolation=use)
    if why == "output_limit":
        res.reason, res.error = why, f"output passed {max_out} bytes (killed)"
    elif why == "wall_time":
        res.reason, res.error = why, f"wall-clock limit of {wall:g} s reached (killed)"
    else:
        verdict = _parse(bufs["reply"])
        if verdict is None:
            tail = err.strip().splitlines()[-1:] or ["no output"]
            res.reason, res.error = "crash", (f"the sandbox ended with code {proc.returncode} "
                                              f"without a verdict: {tail[0]}")[:500]
        else:
            res.reason, res.error, res.value = verdict["reason"], verdict.get("error"), \
                verdict.get("value")
            res.ok = res.reason == "ok"
    return res


def _collect(proc, r_reply: int, wall: float, max_out: int):
    """Read stdout, stderr and the reply incrementally until all close, the wall clock passes,
    or the output passes its cap; kill the sandbox in the last two cases."""
    sel = selectors.DefaultSelector()
    names = {proc.stdout.fileno(): "out", proc.stderr.fileno(): "err", r_reply: "reply"}
    for fd in names:
        sel.register(fd, selectors.EVENT_READ)
    bufs = {"out": bytearray(), "err": bytearray(), "reply": bytearray()}
    deadline, why, exited_at = time.monotonic() + wall, None, None
    while sel.get_map():
        now = time.monotonic()
        if now >= deadline:
            why = "wall_time"
            break
        if exited_at is None and _exited(proc.pid):
            exited_at = now
        if exited_at is not None and now - exited_at > 1.0:
            break  # the supervisor is gone; what still holds a pipe is killed below
        for key, _ in sel.select(timeout=min(deadline - now, 0.1)):
            block = os.read(key.fd, 1 << 16)
            if not block:
                sel.unregister(key.fd)
                continue
            name = names[key.fd]
            if name == "reply" and len(bufs["reply"]) > MAX_RESULT_BYTES + 4096:
                continue  # the supervisor caps the result; this only bounds our memory
            bufs[name] += block
            if len(bufs["out"]) + len(bufs["err"]) > max_out:
                why = "output_limit"
                break
        if why:
            break
    sel.close()
    _kill(proc)
    return bufs, why


def _exited(pid: int) -> bool:
    # without reaping it: the zombie keeps its process group id ours until _kill has used it
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _kill(proc) -> None:
    for how in (lambda: os.killpg(proc.pid, signal.SIGKILL), proc.kill):
        try:
            how()
        except (ProcessLookupError, PermissionError, OSError):
            pass
    proc.wait()
    for f in (proc.stdout, proc.stderr):
        f.close()


def _parse(data: bytes):
    try:
        verdict = json.loads(data.decode("utf-8", "replace"))
    except (ValueError, RecursionError):
        return None
    if not isinstance(verdict, dict) or verdict.get("reason") not in REASONS:
        return None
    return verdict
