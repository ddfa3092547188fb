"""Three replicas, each an application process beside a sidecar of its own, on one SQLite store;
and the checks the APScheduler and Celery beat runs share: what the ledger says about slots."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.replicas import ledger
from tests.support import Sidecar

CLIENT_DIR = Path(__file__).resolve().parents[2]


@dataclass
class Replica:
    name: str
    sidecar: Sidecar
    app: subprocess.Popen[bytes]

    def stop_app(self, sig: int) -> int | None:
        if self.app.poll() is None:
            self.app.send_signal(sig)
        return self.app.wait(timeout=30)


def start_app(
    args: Sequence[str], name: str, sidecar: Sidecar, env: dict[str, str], log: Path
) -> subprocess.Popen[bytes]:
    """`python ARGS` from the client's directory (so `tests.replicas` imports), talking to
    `sidecar`."""
    environment = {**os.environ, **env, "LEASEHOLD_SIDECAR": sidecar.url, "REPLICA": name}
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, *args],
            cwd=CLIENT_DIR,
            env=environment,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def start_replicas(
    store: str, tmp: Path, args: Sequence[str], env: dict[str, str], names: Sequence[str]
) -> list[Replica]:
    replicas = []
    for name in names:
        sidecar = Sidecar(store, tmp / f"{name}-sidecar.log", ("--holder", name))
        app = start_app(args, name, sidecar, env, tmp / f"{name}-app.log")
        replicas.append(Replica(name, sidecar, app))
    return replicas


def stop_all(replicas: Sequence[Replica]) -> None:
    for replica in replicas:
        if replica.app.poll() is None:
            replica.app.kill()
            replica.app.wait()
        replica.sidecar.stop(signal.SIGKILL)


def starts(lines: list[dict[str, Any]], job: str) -> list[dict[str, Any]]:
    return [line for line in lines if line["phase"] == "start" and line["job"] == job]


def ends(lines: list[dict[str, Any]], job: str) -> list[dict[str, Any]]:
    return [line for line in lines if line["phase"] == "end" and line["job"] == job]


def missing(lines: list[dict[str, Any]], job: str, start: float, end: float) -> list[int]:
    """The 1-second slots in [start, end) (seconds since the epoch) that no sweep started."""
    ran = {line["slot"] for line in starts(lines, job)}
    first = int(start) + 1
    return [s * 1000 for s in range(first, int(end)) if s * 1000 not in ran]


def sweep_in_progress(
    path: str, replicas: Sequence[Replica], work: float, limit: float = 10.0
) -> dict[str, Any]:
    """Waits until a sweep of one of `replicas` has started and has a good part of its work
    left; returns its start line."""
    names = {r.name for r in replicas}
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        lines = ledger.read(path)
        ended = {(line["job"], line["slot"]) for line in lines if line["phase"] == "end"}
        for line in lines:
            if (
                line["phase"] == "start"
                and line["replica"] in names
                and (line["job"], line["slot"]) not in ended
                and time.time() - line["at"] < work / 3
            ):
                return line
        time.sleep(0.01)
    raise TimeoutError("no sweep in progress")


def assert_once_per_slot(lines: list[dict[str, Any]], job: str, killed: str | None = None) -> None:
    """Each slot started once, but for one whose run was cut off on the `killed` replica: the
    sidecars run it again (at least once), as `retry` with attempt 2, on another replica."""
    first: dict[int, dict[str, Any]] = {}
    for start in starts(lines, job):
        earlier = first.setdefault(start["slot"], start)
        if earlier is start:
            continue
        rerun = (
            killed is not None
            and earlier["replica"] == killed
            and start["replica"] != killed
            and start.get("trigger") == "retry"
            and start.get("attempt", 1) > 1
        )
        assert rerun, f"{job}: slot {start['slot']} started twice: {earlier} then {start}"
