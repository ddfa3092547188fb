"""Real processes for the tests: `leasehold serve` sidecars on free ports, and `leasehold
history` to read what the store recorded."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[3]
#: The binary under test: $LEASEHOLD_BIN, else the checkout's debug build.
BIN = os.environ.get("LEASEHOLD_BIN") or str(ROOT / "target" / "debug" / "leasehold")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_until(what: str, check: Any, limit: float = 15.0) -> None:
    deadline = time.monotonic() + limit
    while True:
        try:
            if check():
                return
        except Exception:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not come up within {limit} s")
        time.sleep(0.05)


class Sidecar:
    """A `leasehold serve` process on a free loopback port."""

    def __init__(self, store: str, log: Path | None = None, extra: tuple[str, ...] = ()) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        args = [BIN, "serve", "--store", store, "--listen", f"127.0.0.1:{port}", *extra]
        stderr = log.open("ab") if log is not None else None
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=stderr)
        wait_until("sidecar", lambda: httpx.get(f"{self.url}/healthz").status_code == 200)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.process.wait(timeout=15)


def history(store: str, task: str) -> list[dict[str, Any]]:
    """The task's run history in the store, newest first."""
    out = subprocess.run(
        [BIN, "history", "--store", store, task, "--json", "--limit", "1000"],
        check=True,
        capture_output=True,
    ).stdout
    runs: list[dict[str, Any]] = json.loads(out)["runs"]
    return runs


def settled_history(store: str, task: str, limit: float = 5.0) -> list[dict[str, Any]]:
    """The task's history once the sidecars have written their last outcomes (they write in
    the background: until then a finished run reads as `running`, or `interrupted`)."""
    deadline = time.monotonic() + limit
    while True:
        runs = history(store, task)
        if all(r["outcome"] not in ("running", "interrupted") for r in runs):
            return runs
        if time.monotonic() > deadline:
            return runs
        time.sleep(0.1)
