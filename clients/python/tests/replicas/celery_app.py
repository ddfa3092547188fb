"""A Celery application whose beat runs beside each replica with the leasehold scheduler: one
periodic task every second, sent by one beat per slot; the worker writes each run to the
ledger ($LEDGER) with the slot and token the beat sent it with. Broker: $BROKER_URL; queue:
$QUEUE (the test's own)."""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery

from leasehold_client.celery import beat_slot
from tests.replicas import ledger

app = Celery("celery_app", broker=os.environ["BROKER_URL"])
app.conf.update(
    beat_scheduler="leasehold_client.celery:LeaseholdScheduler",
    leasehold_ttl=float(os.environ.get("TTL_SECONDS", "3")),
    # An entry name with spaces: its task is `beat-sweep`.
    beat_schedule={"beat sweep": {"task": "tests.replicas.celery_app.sweep", "schedule": 1.0}},
    beat_max_loop_interval=1,
    task_default_queue=os.environ["QUEUE"],
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)


@app.task(bind=True)
def sweep(self: Any) -> None:
    sent = beat_slot(self.request)
    assert sent is not None
    line = {"job": "beat", "slot": sent.slot, "token": str(sent.token), "replica": "worker"}
    ledger.write(os.environ["LEDGER"], phase="start", **line)
    time.sleep(float(os.environ.get("WORK_SECONDS", "0.05")))
    ledger.write(os.environ["LEDGER"], phase="end", **line)
