"""Run many small jobs in child processes, so that one that hangs or dies is a result, not a
stuck or dead sweep.

The parent (:func:`run_isolated`) keeps ``workers`` children busy, one job at a time each;
a child (:func:`serve`) reads job names from stdin and answers with protocol lines on stdout
(``start``, ``phase``, ``row``; anything else the job prints is ignored). A job past its hard
time limit gets its child killed, and a job whose child dies gets a row from ``on_fail``; a
fresh child takes over the remaining jobs. Children are replaced every ``recycle`` jobs too,
so the memory of imported model code does not pile up.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

PREFIX = "@@isolated "

Row = dict[str, Any]
FailRow = Callable[[str, str, str], Row]  # (job, phase, why) -> row


def emit(event: str, **data: Any) -> None:
    """Child side: one protocol line on stdout."""
    sys.stdout.write(PREFIX + json.dumps({"event": event, **data}, default=str) + "\n")
    sys.stdout.flush()


def serve(handle: Callable[[str, Callable[[str], None]], Row]) -> None:
    """Child side: for each job name on stdin, ``handle(job, phase)`` -> row, sent back.
    ``phase(name)`` tells the parent what the job is doing (used if it must be killed)."""
    for line in sys.stdin:
        job = line.strip()
        if not job:
            continue
        emit("start", job=job)
        row = handle(job, lambda name, job=job: emit("phase", job=job, phase=name))
        emit("row", job=job, row=row)


@dataclass
class _Child:
    command: Sequence[str]
    events: queue.Queue
    ident: int
    env: dict[str, str] | None = None
    proc: subprocess.Popen = field(init=False)
    log: IO[str] = field(init=False)
    job: str | None = None
    phase: str = "start"
    since: float = 0.0
    done: int = 0
    heard: bool = False  # it has sent a protocol line (it started up)

    def __post_init__(self) -> None:
        self.log = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(list(self.command), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     bufsize=1, env=self.env)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        proc = self.proc
        for line in proc.stdout:
            if line.startswith(PREFIX):
                try:
                    self.events.put((self.ident, proc, json.loads(line[len(PREFIX):])))
                except json.JSONDecodeError:
                    continue
        self.events.put((self.ident, proc, {"event": "eof"}))

    def send(self, job: str) -> None:
        self.job, self.phase, self.since = job, "start", time.monotonic()
        try:
            self.proc.stdin.write(job + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:  # it died; its end-of-output event reports the job
            pass

    def last_error(self) -> str:
        self.log.seek(0)
        lines = [line.strip() for line in self.log.read().splitlines() if line.strip()]
        return lines[-1][:300] if lines else ""

    def stop(self, kill: bool = False) -> None:
        if self.proc.poll() is None:
            if kill:
                self.proc.kill()
            else:
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def run_isolated(jobs: Sequence[str], command: Sequence[str], on_fail: FailRow, *,
                 workers: int = 2, limit_s: float = 120.0, recycle: int = 40,
                 env: dict[str, str] | None = None,
                 progress: Callable[[str, Row], None] | None = None) -> dict[str, Row]:
    """Rows of every job, each computed by a child running ``command`` (which calls
    :func:`serve`) with environment ``env`` (None: this process's). A job running longer
    than ``limit_s`` or whose child dies gets ``on_fail(job, phase, why)``."""
    events: queue.Queue = queue.Queue()
    pending, rows = deque(jobs), {}
    children: dict[int, _Child] = {}
    counter = iter(range(10**9))
    early_deaths = [0]  # children that died before saying anything, in a row

    def spawn() -> None:
        ident = next(counter)
        children[ident] = _Child(command, events, ident, env)

    def finish(child: _Child, row: Row) -> None:
        rows[child.job] = row
        if progress is not None:
            progress(child.job, row)
        child.job = None
        child.done += 1

    def replace(child: _Child, kill: bool) -> None:
        child.stop(kill=kill)
        del children[child.ident]
        if pending:
            spawn()

    for _ in range(min(workers, len(pending))):
        spawn()
    try:
        while pending or any(c.job is not None for c in children.values()):
            for child in list(children.values()):
                if child.job is None and pending and child.proc.poll() is None:
                    child.send(pending.popleft())
            try:
                ident, proc, msg = events.get(timeout=0.5)
            except queue.Empty:
                ident, proc, msg = None, None, None
            child = children.get(ident) if ident is not None else None
            if child is not None and child.proc is proc:
                child.heard = child.heard or msg["event"] != "eof"
                if msg["event"] == "phase" and msg.get("job") == child.job:
                    child.phase = msg["phase"]
                elif msg["event"] == "row" and msg.get("job") == child.job:
                    finish(child, msg["row"])
                    if child.done >= recycle:
                        replace(child, kill=False)
                elif msg["event"] == "eof":
                    code = child.proc.wait()
                    early_deaths[0] = 0 if child.heard else early_deaths[0] + 1
                    if early_deaths[0] >= 3:
                        raise RuntimeError(f"worker processes die on start (exit {code}): "
                                           f"{child.last_error()}")
                    if child.job is not None:
                        why = f"worker process died (exit {code}): {child.last_error()}"
                        finish(child, on_fail(child.job, child.phase, why))
                    replace(child, kill=False)
            now = time.monotonic()
            for child in list(children.values()):
                if child.job is not None and now - child.since > limit_s:
                    finish(child, on_fail(child.job, child.phase,
                                          f"timeout: still in {child.phase} after {limit_s:.0f} s"))
                    replace(child, kill=True)
    finally:
        for child in list(children.values()):
            child.stop(kill=True)
    return rows
