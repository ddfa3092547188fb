"""Three Celery beats (tests/replicas/celery_app.py: one entry every second), each beside its own
sidecar, on one SQLite store (3 s task-lease ttl), and a worker, with Redis as the broker (a
database and a queue of the test's own). Checked from the ledger the worker writes (the slot and
token each message was sent with) and the store's run history (which beat sent it):
- every slot is sent once, and none is missed while the beats run;
- SIGTERM of the beat that sent last (then its sidecar): the next slot is sent by another beat,
  on time;
- SIGKILL of the beat that sent last, with its sidecar: the remaining beat sends the following
  slots, within the task lease's ttl."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.replicas import ledger
from tests.replicas.harness import (
    CLIENT_DIR,
    Replica,
    assert_once_per_slot,
    missing,
    start_replicas,
    starts,
    stop_all,
)
from tests.support import settled_history

TTL = 3.0
TASK = "beat-sweep"
#: The test's own Redis database on the shared server (LEASEHOLD_TEST_REDIS_URL).
REDIS_DB = 12


def last_sender(store: str, replicas: list[Replica]) -> Replica:
    """The live beat that sent the latest slot, by the run history's holder
    (`INSTANCE@NAME#...`: NAME is the beat's sidecar)."""
    names = {r.name: r for r in replicas}
    for entry in settled_history(store, TASK):
        name = entry["holder"].split("#")[0].split("@")[-1]
        if entry["outcome"] == "ok" and name in names:
            return names[name]
    raise AssertionError("no beat sent anything")


@pytest.fixture
def broker() -> str:
    base = os.environ.get("LEASEHOLD_TEST_REDIS_URL", "redis://127.0.0.1:6379").rstrip("/")
    return f"{base}/{REDIS_DB}"


def test_three_beats_send_each_slot_once_through_sigterm_and_sigkill(
    tmp_path: Path, store: str, broker: str
) -> None:
    path = str(tmp_path / "runs.ledger")
    queue = f"leasehold-test-{uuid.uuid4().hex}"
    env = {"LEDGER": path, "BROKER_URL": broker, "QUEUE": queue, "TTL_SECONDS": str(TTL)}
    worker_log = (tmp_path / "worker.log").open("ab")
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tests.replicas.celery_app", "worker",
         "--pool=solo", "--without-gossip", "--without-mingle", "--without-heartbeat",
         "--loglevel=INFO"],
        cwd=CLIENT_DIR, env={**os.environ, **env}, stdout=worker_log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    replicas: list[Replica] = []
    try:
        for name in ("b1", "b2", "b3"):
            beat = ["-m", "celery", "-A", "tests.replicas.celery_app", "beat", "--loglevel=INFO",
                    "-s", str(tmp_path / f"{name}-schedule")]  # fmt: skip
            replicas += start_replicas(store, tmp_path, beat, env, [name])
        time.sleep(4)
        t0 = time.time()
        time.sleep(4)

        leaving = last_sender(store, replicas)
        t1 = time.time()
        assert leaving.stop_app(signal.SIGTERM) == 0, "the beat exits 0 on SIGTERM"
        assert leaving.sidecar.stop(signal.SIGTERM) == 0
        time.sleep(3)

        live = [r for r in replicas if r is not leaving]
        killed = last_sender(store, live)
        t2 = time.time()
        killed.app.kill()
        killed.sidecar.stop(signal.SIGKILL)
        time.sleep(TTL + 2)
        t3 = time.time()
    finally:
        stop_all(replicas)
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=30)

    lines = ledger.read(path)
    assert_once_per_slot(lines, "beat")
    # While the beats run (the SIGTERM's handover included), every slot is sent and run.
    assert missing(lines, "beat", t0, t2 - 1) == []
    history = {h["slot"]: h for h in settled_history(store, TASK)}
    sent_by = {slot: h["holder"].split("#")[0].split("@")[-1] for slot, h in history.items()}
    # Every message the worker ran is a run in the history, sent with that run's token.
    for start in starts(lines, "beat"):
        entry = history[start["slot"]]
        assert entry["outcome"] == "ok", entry
        assert entry["token"] == start["token"]
    # After the SIGTERM the next slot was sent by another beat, on time.
    after_term = sorted(s for s, name in sent_by.items() if s > t1 * 1000)
    assert sent_by[after_term[0]] != leaving.name
    assert after_term[0] - t1 * 1000 < 1500
    assert all(sent_by[s] != leaving.name for s in after_term)
    # After the SIGKILL the remaining beat carries on within the ttl; nothing is sent twice.
    after_kill = [s["at"] for s in starts(lines, "beat") if s["at"] > t2]
    assert after_kill, "nothing ran after the SIGKILL"
    assert min(after_kill) - t2 <= TTL + 1.5
    # One beat left: its own timer drifts by the time each send takes, so it can step over a
    # slot now and then (with two or more, another one covers it).
    assert len(missing(lines, "beat", t2 + TTL, t3 - 1)) <= 1
