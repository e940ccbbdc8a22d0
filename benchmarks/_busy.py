"""CPU-burning neighbours for the benchmarks' ``--busy N`` mode.

Each neighbour is a separate interpreter running a tight arithmetic loop: it never sleeps,
never blocks and never yields, as a decode thread or a tokenizer beside an engine keeps a core
busy. The group is started once per run and switched between *quiet* (every neighbour stopped,
``SIGSTOP``) and *busy* (continued, ``SIGCONT``) round by round, so quiet and busy rounds
interleave and whatever else the machine does lands on both alike. Every signal goes to the
neighbours' own pids, and they are ended by pid (``SIGKILL``) when the run ends, never by name.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

__all__ = ["LOOP", "Neighbours"]

#: The neighbours' work: integer arithmetic in a loop with no sleep, no I/O, no system call.
LOOP = "x = 1\nwhile True:\n    x = (x * 1103515245 + 12345) & 0x7FFFFFFF\n"

#: After SIGCONT or SIGSTOP: long enough for the scheduler to see the change (and for a waiter's
#: load sample, taken at most every 10 ms, to follow it) before a round is timed.
SETTLE_S = 0.03


class Neighbours:
    """``n`` busy-looping processes, stopped or running on demand; a context manager.

    Args:
        n: how many (0: none; ``quiet()`` and ``busy()`` then do nothing).
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.procs: list[subprocess.Popen[bytes]] = []
        self.running = False

    def __enter__(self) -> Neighbours:
        self.procs = [subprocess.Popen([sys.executable, "-c", LOOP], stdin=subprocess.DEVNULL)
                      for _ in range(self.n)]
        self.running = True
        if self.procs:
            time.sleep(0.3)  # past the interpreters' start-up, into the loop
        self.quiet()
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            try:
                os.kill(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in self.procs:
            p.wait()
        self.procs = []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def _signal(self, sig: int, running: bool) -> None:
        if not self.procs or self.running == running:
            return
        for p in self.procs:
            os.kill(p.pid, sig)
        self.running = running
        time.sleep(SETTLE_S)

    def quiet(self) -> None:
        """Stop every neighbour (SIGSTOP)."""
        self._signal(signal.SIGSTOP, False)

    def busy(self) -> None:
        """Let every neighbour run again (SIGCONT)."""
        self._signal(signal.SIGCONT, True)
