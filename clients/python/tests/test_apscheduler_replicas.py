"""Three replicas of an APScheduler service (tests/replicas/apscheduler_replica.py: an interval
job and a cron job, each a 1 s schedule with 0.3 s of work), each with its own sidecar, on one
SQLite store (3 s task-lease ttl). Checked from the ledger the sweeps write and the store's run
history:
- no slot of either job ever starts twice, and none is missed in normal operation;
- SIGTERM of the replica in the middle of a sweep (app, then its sidecar): the sweep finishes
  and is recorded ok, and the next slot runs on another replica at once;
- SIGKILL of the replica in the middle of a sweep, app and sidecar together: the others take
  over within the task lease's ttl."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from tests.replicas import ledger
from tests.replicas.harness import (
    assert_once_per_slot,
    ends,
    missing,
    start_replicas,
    starts,
    stop_all,
    sweep_in_progress,
)
from tests.support import settled_history

TTL = 3.0
WORK = 0.3
JOBS = {"interval": "aps-interval", "cron": "aps-cron"}


def test_three_replicas_one_sweep_per_slot_through_sigterm_and_sigkill(
    tmp_path: Path, store: str
) -> None:
    path = str(tmp_path / "sweeps.ledger")
    env = {"LEDGER": path, "WORK_SECONDS": str(WORK), "TTL_SECONDS": str(TTL)}
    args = ["-m", "tests.replicas.apscheduler_replica"]
    replicas = start_replicas(store, tmp_path, args, env, ["r1", "r2", "r3"])
    try:
        time.sleep(2.5)
        t0 = time.time()
        time.sleep(3)

        # SIGTERM the replica in the middle of a sweep: its scheduler stops, the sweep
        # finishes and reports done, the app exits 0; then its sidecar.
        termed = sweep_in_progress(path, replicas, WORK)
        leaving = next(r for r in replicas if r.name == termed["replica"])
        assert leaving.stop_app(signal.SIGTERM) == 0, "the app exits 0 on SIGTERM"
        left = time.time()
        assert leaving.sidecar.stop(signal.SIGTERM) == 0, "the sidecar exits 0 on SIGTERM"
        time.sleep(3)

        # SIGKILL another replica, app and sidecar together, in the middle of a sweep: its
        # run's lease stays in the store until its ttl runs out.
        live = [r for r in replicas if r is not leaving]
        killed_run = sweep_in_progress(path, live, WORK)
        killed = next(r for r in live if r.name == killed_run["replica"])
        t2 = time.time()
        killed.app.kill()
        killed.sidecar.stop(signal.SIGKILL)
        time.sleep(TTL + 3)
        t3 = time.time()
    finally:
        stop_all(replicas)

    lines = ledger.read(path)
    assert ends(lines, termed["job"]), "sweeps ran"
    # The sweep in progress at SIGTERM finished there.
    assert any(
        e["slot"] == termed["slot"] and e["replica"] == leaving.name
        for e in ends(lines, termed["job"])
    )
    # The slot after the one running at SIGTERM (held by that run to its end) ran elsewhere,
    # on time.
    following = min(
        (s for s in starts(lines, termed["job"]) if s["slot"] > termed["slot"]),
        key=lambda s: s["slot"],
    )
    assert following["slot"] == termed["slot"] + 1000
    assert following["replica"] != leaving.name
    assert following["at"] * 1000 - following["slot"] < 1000, following
    for job, task in JOBS.items():
        assert_once_per_slot(lines, job, killed.name)
        # Every sweep ended, but the one on the SIGKILLed replica.
        for start in starts(lines, job):
            if start["replica"] == killed.name and start["at"] > t2 - 1:
                continue
            if start["at"] > t3 - 1:
                continue
            assert any(
                e["slot"] == start["slot"] and e["token"] == start["token"]
                for e in ends(lines, job)
            ), start
        # Normal operation and the SIGTERM handover: nothing missed.
        assert missing(lines, job, t0, t2 - 1) == [], f"{job}: missed before the kill"
        # Nothing started on the SIGTERMed replica once it had exited.
        assert all(s["at"] < left for s in starts(lines, job) if s["replica"] == leaving.name)
        # After the SIGKILL: the others resume within the ttl.
        first_after = min(s["at"] for s in starts(lines, job) if s["at"] > t2)
        assert first_after - t2 <= TTL + 1.5, f"{job}: resumed {first_after - t2:.1f} s after"
        assert len(missing(lines, job, t2, t3 - 1)) <= TTL + 1
        # Then steady again.
        assert missing(lines, job, t2 + TTL + 1.5, t3 - 1) == []
        # Every sweep that ended is in the run history as ok, with its token and replica.
        recorded = {(h["slot"], str(h.get("token"))): h for h in settled_history(store, task)}
        for end in ends(lines, job):
            entry = recorded[(end["slot"], end["token"])]
            assert entry["outcome"] == "ok", entry
            # INSTANCE@SIDECAR#N: the app's instance, through its replica's sidecar.
            assert entry["holder"].split("#")[0].split("@")[-1] == end["replica"], entry
