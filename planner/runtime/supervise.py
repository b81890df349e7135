"""Run a launcher (``torchrun``) so that nothing it starts outlives ``planner run``.

torchrun starts each worker in a session of its own (torch elastic's ``SubprocessHandler``
passes ``start_new_session=True``) and stops them itself when it receives SIGTERM, SIGINT or
SIGHUP (``torch/distributed/elastic/multiprocessing/api.py``: the signal handler raises, the
agent sends its workers SIGTERM, waits, then SIGKILL). A terminal's Ctrl-C reaches only the
foreground process group, and a SIGTERM to ``planner run`` reaches only ``planner run``: left
alone, torchrun and its workers keep training. So ``supervise``:

1. starts the launcher in a session of its own (a terminal's signals reach ``planner run``
   alone, which decides what the launcher gets);
2. on SIGINT, SIGTERM or SIGHUP sends the launcher SIGTERM, which it relays to its workers
   (SIGTERM, not the SIGINT of a Ctrl-C: a Python worker still importing torch would print a
   ``KeyboardInterrupt`` traceback per rank; SIGTERM is also what Slurm sends to stop a
   job); a second signal, or ``grace_s`` seconds without the launcher ending, kills every
   process of the tree with SIGKILL;
3. on Linux becomes a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``, proc(5)), so a
   worker whose launcher died is re-parented to ``planner run`` instead of init, and keeps
   a list of the tree's processes (``/proc``), so that whatever is left when the launcher
   ends is killed and reaped.

Returns the launcher's exit status, or ``128 + signal`` when a signal stopped it (130 for
Ctrl-C, 143 for SIGTERM), as a shell reports a process a signal ended.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import FrameType

__all__ = ["GRACE_S", "descendants", "supervise"]

#: Seconds the launcher has to stop its workers after a forwarded signal before the whole
#: tree is killed: torch elastic waits 30 s for its workers after SIGTERM
#: (``SimpleElasticAgent._shutdown(death_sig, timeout=30)``), plus a margin for itself.
GRACE_S = 35.0
#: How often (seconds) the wait checks the grace period's end.
POLL_S = 0.5
#: How often (seconds) the tree's processes are listed while the launcher runs: each list
#: reads every /proc/PID/stat (about 25 us a process here), all through a training run, and
#: the workers live as long as it.
SCAN_S = 5.0
#: The signals forwarded to the launcher.
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h

Process = tuple[int, int]  # (pid, start time in clock ticks since boot): a pid is reused


def _stat(pid: int) -> tuple[int, int] | None:
    """``(parent pid, start time)`` of process ``pid`` from ``/proc/PID/stat`` (proc(5):
    fields 4 and 22, counted after the parenthesised command name), or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    return int(fields[1]), int(fields[19])


def descendants(root: int) -> set[Process]:
    """Every live process below ``root`` in the process tree (empty where there is no
    ``/proc``)."""
    children: dict[int, list[Process]] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit() and (st := _stat(int(entry.name))) is not None:
                children.setdefault(st[0], []).append((int(entry.name), st[1]))
    out: set[Process] = set()
    todo = [root]
    while todo:
        for proc in children.get(todo.pop(), []):
            if proc not in out:
                out.add(proc)
                todo.append(proc[0])
    return out


def _alive(procs: set[Process]) -> set[Process]:
    """Those of ``procs`` still running as the same process (same start time), zombies
    aside."""
    out = set()
    for pid, start in procs:
        st = _stat(pid)
        if st is not None and st[1] == start and not _zombie(pid):
            out.add((pid, start))
    return out


def _zombie(pid: int) -> bool:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return text[text.rfind(")") + 2:].startswith("Z")


def _kill(procs: set[Process], sig: int) -> None:
    for pid, _ in procs:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def _subreaper(on: bool) -> bool:
    """Make this process a child subreaper (or stop being one); False where the system has
    no ``prctl`` (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _reap(procs: set[Process]) -> None:
    """Collect the exit status of those of ``procs`` that became this process's children
    (re-parented to it as subreaper) and ended or were killed, so none is left a zombie;
    others are not ours to wait for."""
    for pid, _ in procs:
        with contextlib.suppress(ChildProcessError, OSError):
            os.waitpid(pid, 0)


def supervise(command: Sequence[str], env: Mapping[str, str], *,
              grace_s: float = GRACE_S) -> int:
    """Run ``command`` (the launcher) with ``env`` and wait for it; every process it starts
    ends with it (see the module docstring)."""
    reaper = _subreaper(True)
    received: list[int] = []
    proc = subprocess.Popen(list(command), env=dict(env), start_new_session=True)
    seen: set[Process] = set()

    def kill_tree() -> None:
        seen.update(descendants(proc.pid))
        _kill(seen | {(proc.pid, 0)}, signal.SIGKILL)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        received.append(signum)
        if len(received) == 1:
            with contextlib.suppress(OSError):
                os.kill(proc.pid, signal.SIGTERM)
        else:  # asked twice: stop now
            kill_tree()

    previous = {s: signal.signal(s, on_signal) for s in SIGNALS}
    try:
        deadline, scan = float("inf"), 0.0
        while proc.poll() is None:
            if time.monotonic() >= scan:
                seen.update(descendants(proc.pid))
                scan = time.monotonic() + SCAN_S
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=POLL_S)
            if received and deadline == float("inf"):
                deadline = time.monotonic() + grace_s
                print(f"planner: {signal.Signals(received[0]).name}: stopping the training "
                      f"processes (again to kill them now; killed after {grace_s:.0f} s)",
                      file=sys.stderr, flush=True)
            if time.monotonic() > deadline:
                kill_tree()
    finally:
        if proc.poll() is None:  # an exception in this loop: the launcher goes too
            proc.kill()
            proc.wait()
        left = _alive(seen)
        _kill(left, signal.SIGKILL)  # workers the launcher did not stop (it was killed)
        if reaper:
            _reap(seen)
            _subreaper(False)
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 128 + received[0] if received else int(proc.returncode)
