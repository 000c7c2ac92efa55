"""A sandbox for model-written programs: each run is a separate Python process with a CPU-time
limit, a memory limit, no network and no file writes, so an infinite loop, a memory bomb or an
attempt to open a socket ends as a failed run with its reason, never as a hung or crashed caller.

``run_python(code, inputs)`` starts ``python -I -S`` (isolated: no user site, no environment
variables, no ``site``), sends it the code and the inputs as JSON on stdin, and reads one JSON
line back. Before running the code the child

- sets ``RLIMIT_CPU`` (``cpu_s`` seconds; the kernel stops the process with SIGXCPU) and
  ``RLIMIT_AS`` (``memory_mb``: an allocation past it raises ``MemoryError``);
- sets ``RLIMIT_FSIZE`` to 0 and ``RLIMIT_NPROC``/``RLIMIT_NOFILE`` low where the platform allows;
- installs an audit hook (PEP 578) that refuses every socket creation or connection, any
  ``open`` for writing, appending or creating, file deletion and renaming, and starting processes
  (``subprocess``, ``os.system``, ``os.exec*``, ``os.fork``, ``os.posix_spawn``).

The parent also keeps a wall-clock limit (``wall_s``, default 2 x cpu_s + 2 s: a program that
sleeps uses no CPU time) and kills the child when it passes it.

The code sees ``inputs`` (a dict) and sets ``result``; its value must be JSON-serialisable; what
it prints is kept apart (``stdout``). The caller gets a ``SandboxResult``: ``ok``, ``value``, ``reason`` ('ok', 'error', 'cpu_time',
'wall_time', 'memory', 'network', 'file_write', 'process', 'crash', 'bad_result') and
``error`` (a one-line message naming what happened).

What it is not: a security boundary against a determined attacker. Audit hooks guard the Python
level; C code reached through ctypes could step around them (ctypes import is refused too), and
the process runs as the caller's user. It is the guard a training loop needs against programs a
model wrote by accident: loops, bombs, stray writes and sockets. POSIX only (``resource``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

REASONS = ("ok", "error", "cpu_time", "wall_time", "memory", "network", "file_write", "process",
           "crash", "bad_result")

# The child: limits, then the audit hook, then the code. Kept as source so the child imports
# nothing of this package (python -I -S: no site-packages, no environment).
_CHILD = r'''
import json, resource, sys

def _limit(name, value):
    what = getattr(resource, name, None)
    if what is None:
        return
    try:
        resource.setrlimit(what, (value, value))
    except (ValueError, OSError):
        pass

spec = json.loads(sys.stdin.readline())
out = sys.stdout
cpu = int(spec["cpu_s"]) if float(spec["cpu_s"]).is_integer() else int(spec["cpu_s"]) + 1
resource.setrlimit(resource.RLIMIT_CPU, (max(cpu, 1), max(cpu, 1) + 1))
mem = int(spec["memory_mb"]) * 1024 * 1024
resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
_limit("RLIMIT_FSIZE", 0)
_limit("RLIMIT_CORE", 0)

class Refused(PermissionError):
    pass

_NET = ("socket.", "http.", "urllib.", "ftplib.", "smtplib.", "telnetlib.")
_PROC = ("subprocess.Popen", "os.system", "os.exec", "os.fork", "os.forkpty", "os.posix_spawn",
         "os.spawn", "os.startfile", "pty.spawn")
_FILE = ("os.remove", "os.unlink", "os.rename", "os.rmdir", "os.mkdir", "os.truncate",
         "os.chmod", "os.chown", "os.link", "os.symlink", "shutil.")

def _hook(event, args):
    if event.startswith(_NET):
        raise Refused(f"network: {event} is not allowed in the sandbox")
    if event.startswith(_PROC):
        raise Refused(f"process: {event} is not allowed in the sandbox")
    if event.startswith(_FILE):
        raise Refused(f"file_write: {event} is not allowed in the sandbox")
    if event == "open":
        path, mode, flags = (list(args) + [None, None, None])[:3]
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & 0o3 != 0)  # O_WRONLY or O_RDWR
        if writing:
            raise Refused(f"file_write: opening {path!r} for writing is not allowed in the sandbox")
    if event == "import" and args and args[0] in ("ctypes", "_ctypes"):
        raise Refused("process: ctypes is not allowed in the sandbox")

import io
printed = io.StringIO()
sys.stdout = printed  # the program's prints are kept apart from the reply line
sys.addaudithook(_hook)
scope = {"inputs": spec["inputs"], "__name__": "__sandbox__"}
try:
    exec(compile(spec["code"], "<program>", "exec"), scope)
    reply = {"reason": "ok", "value": scope.get("result"), "stdout": printed.getvalue()[-2000:]}
    try:
        text = json.dumps(reply)
    except (TypeError, ValueError) as err:
        text = json.dumps({"reason": "bad_result", "error": f"result is not JSON: {err}"})
except MemoryError:
    text = json.dumps({"reason": "memory", "error": "memory limit reached (MemoryError)"})
except Refused as err:
    reason = str(err).split(":", 1)[0]
    text = json.dumps({"reason": reason, "error": str(err)})
except RecursionError as err:
    text = json.dumps({"reason": "error", "error": f"RecursionError: {err}"})
except BaseException as err:  # noqa: BLE001 - the program's own failure, reported
    text = json.dumps({"reason": "error", "error": f"{type(err).__name__}: {err}"[:500]})
out.write(text + "\n")
out.flush()
'''


@dataclass
class SandboxResult:
    ok: bool
    value: object = None
    reason: str = "ok"
    error: str | None = None
    stdout: str = ""  # the program's own prints (the last 2000 characters), when it finished

    def __bool__(self) -> bool:
        return self.ok


def run_python(code: str, inputs: dict | None = None, cpu_s: float = 1.0, memory_mb: int = 256,
               wall_s: float | None = None) -> SandboxResult:
    """Run ``code`` (Python source that reads ``inputs`` and sets ``result``) in a fresh sandboxed
    process (module docstring) and return its ``SandboxResult``; never raises for anything the
    program does. Bad limits (cpu_s <= 0, memory_mb < 32) raise ValueError."""
    if cpu_s <= 0:
        raise ValueError(f"cpu_s must be > 0, got {cpu_s}")
    if memory_mb < 32:
        raise ValueError(f"memory_mb must be >= 32 (the interpreter itself needs ~10 MB), got {memory_mb}")
    if not isinstance(code, str):
        raise ValueError(f"code must be a string of Python source, got {type(code).__name__}")
    wall = 2.0 * cpu_s + 2.0 if wall_s is None else float(wall_s)
    try:
        spec = json.dumps({"code": code, "inputs": inputs or {}, "cpu_s": cpu_s,
                           "memory_mb": memory_mb})
    except (TypeError, ValueError) as err:
        raise ValueError(f"inputs must be JSON-serialisable: {err}") from err
    try:
        proc = subprocess.run([sys.executable, "-I", "-S", "-c", _CHILD], input=spec + "\n",
                              capture_output=True, text=True, timeout=wall)
    except subprocess.TimeoutExpired:  # subprocess.run kills the child before raising
        return SandboxResult(False, reason="wall_time",
                             error=f"wall-clock limit of {wall:g} s reached (killed)")
    line = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
    try:
        reply = json.loads(line) if line else None
    except json.JSONDecodeError:
        reply = None  # the program printed past our line (its own prints come first) or died
    if reply is None or not isinstance(reply, dict) or "reason" not in reply:
        return SandboxResult(False, reason=_signal_reason(proc.returncode),
                             error=_signal_error(proc.returncode, proc.stderr))
    if reply["reason"] == "ok":
        return SandboxResult(True, value=reply.get("value"), stdout=reply.get("stdout", ""))
    return SandboxResult(False, reason=reply["reason"], error=reply.get("error"))


def _signal_reason(code: int) -> str:
    import signal

    if code in (-signal.SIGXCPU, -signal.SIGKILL):  # RLIMIT_CPU: SIGXCPU, then SIGKILL at the hard limit
        return "cpu_time"
    if code == -signal.SIGXFSZ:
        return "file_write"
    return "crash"


def _signal_error(code: int, stderr: str) -> str:
    reason = _signal_reason(code)
    if reason == "cpu_time":
        return "CPU-time limit reached (killed by the kernel)"
    if reason == "file_write":
        return "file size limit reached (SIGXFSZ)"
    tail = stderr.strip().splitlines()[-1] if stderr.strip() else "no output"
    return f"the program's process ended with code {code}: {tail}"[:500]
