"""One replica of a service that runs its sweeps with APScheduler 3, gated by its sidecar
($LEASEHOLD_SIDECAR): an interval job and a cron job in a zone, each sweep written to the ledger
($LEDGER) as it starts and ends. SIGTERM: the scheduler stops, a running sweep finishes and
reports its outcome, the process exits 0."""

from __future__ import annotations

import os
import signal
import threading
import time

from apscheduler.schedulers.background import BackgroundScheduler

from leasehold_client import Client, Run
from leasehold_client.apscheduler import LeaseholdExecutor, current_run
from tests.replicas import ledger

LEDGER = os.environ["LEDGER"]
REPLICA = os.environ["REPLICA"]
WORK = float(os.environ.get("WORK_SECONDS", "0.3"))
TTL = float(os.environ.get("TTL_SECONDS", "3"))


def sweep(job: str) -> None:
    run = current_run()
    assert run is not None
    # A slot whose run was cut off (its replica SIGKILLed) runs again as `retry`, attempt 2.
    trigger, attempt = (run.trigger, run.attempt) if isinstance(run, Run) else ("ungated", 1)
    line = {
        "job": job,
        "slot": run.slot,
        "token": str(run.token),
        "trigger": trigger,
        "attempt": attempt,
        "replica": REPLICA,
    }
    ledger.write(LEDGER, phase="start", **line)
    time.sleep(WORK)
    run.check()
    ledger.write(LEDGER, phase="end", **line)


def main() -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    client = Client()
    scheduler = BackgroundScheduler(executors={"default": LeaseholdExecutor(client, ttl=TTL)})
    scheduler.add_job(sweep, "interval", seconds=1, args=["interval"], id="aps-interval")
    scheduler.add_job(
        sweep, "cron", second="*", timezone="Europe/Berlin", args=["cron"], id="aps-cron"
    )
    scheduler.start()
    stop.wait()
    scheduler.shutdown(wait=True)
    client.close()


if __name__ == "__main__":
    main()
