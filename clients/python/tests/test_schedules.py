"""APScheduler triggers and Celery beat schedules as the sidecar's schedules: the firings the
sidecar computes for the translated schedule (`leasehold next`, the same code as its ticks) are
the firings APScheduler and Celery compute for the original; what cron cannot say is refused."""

from __future__ import annotations

import json
import logging
import subprocess
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.date import DateTrigger
from apscheduler.triggers.interval import IntervalTrigger
from celery import Celery
from celery.schedules import BaseSchedule, crontab
from celery.schedules import schedule as every

from leasehold_client import Client
from leasehold_client import apscheduler as aps
from leasehold_client import celery as beat

from .support import BIN, free_port

# Away from daylight-saving changes: there APScheduler and Celery each have rules of their own.
START = datetime(2027, 5, 3, 10, 17, 23, tzinfo=UTC)
FIRINGS = 8


def sidecar_firings(cron: str, tz: str) -> list[datetime]:
    after = START.strftime("%Y-%m-%dT%H:%M:%SZ")
    args = [BIN, "next", "--cron", cron, "--tz", tz, "-n", str(FIRINGS), "--after", after]
    out = subprocess.run([*args, "--json"], check=True, capture_output=True).stdout
    return [datetime.fromtimestamp(f["slot_ms"] / 1000, UTC) for f in json.loads(out)["firings"]]


@pytest.mark.parametrize(
    "fields",
    [
        {"hour": 3},
        {"minute": "*/15", "hour": "9-17", "day_of_week": "mon-fri"},
        {"day_of_week": "5-6", "hour": 7, "timezone": "America/New_York"},
        {"day_of_week": "*/2", "timezone": "Europe/Berlin"},
        {"day_of_week": "1,3", "minute": 30},
        {"month": "jan-mar,may", "day": "1,15", "hour": 4},
        {"second": "*/10", "minute": "18"},
        {"day": "*/10", "hour": 0},
    ],
)
def test_apscheduler_cron_fires_at_the_same_times(fields: dict[str, Any]) -> None:
    trigger = CronTrigger(**{"timezone": "UTC", **fields})
    schedule = aps.schedule_of(trigger)
    expected: list[datetime] = []
    previous = None
    now = START + timedelta(microseconds=1)
    for _ in range(FIRINGS):
        fire = trigger.get_next_fire_time(previous, now)
        assert fire is not None
        expected.append(fire.astimezone(UTC))
        previous, now = fire, fire + timedelta(microseconds=1)
    assert sidecar_firings(schedule["cron"], schedule["tz"]) == expected, schedule


def test_apscheduler_interval_is_every() -> None:
    assert aps.schedule_of(IntervalTrigger(minutes=5)) == {"every": timedelta(minutes=5)}


@pytest.mark.parametrize(
    ("trigger", "says"),
    [
        (CronTrigger(day="last"), "day=last"),
        (CronTrigger(day="2nd fri"), "day=2nd fri"),
        (CronTrigger(year=2028), "year"),
        (CronTrigger(week=7), "week"),
        (CronTrigger(day=1, day_of_week="mon"), "both day and day_of_week"),
        (DateTrigger(datetime(2030, 1, 1, tzinfo=UTC)), "no gated schedule"),
    ],
)
def test_apscheduler_triggers_cron_cannot_say_are_refused(trigger: object, says: str) -> None:
    with pytest.raises(aps.UnsupportedTrigger, match=says):
        aps.schedule_of(trigger)


def celery_app(zone: str) -> Celery:
    app = Celery(set_as_current=False)
    app.conf.timezone = zone
    return app


@pytest.mark.parametrize(
    ("fields", "zone"),
    [
        ({"minute": 0, "hour": 3}, "UTC"),
        ({"minute": "*/15", "hour": "9-17", "day_of_week": "mon-fri"}, "Europe/Berlin"),
        ({"minute": 30, "hour": 7, "day_of_week": "sat,sun"}, "America/New_York"),
        ({"minute": 0, "hour": 4, "day_of_month": "1,15", "month_of_year": "1-3,5"}, "UTC"),
        ({"minute": 5, "hour": "*/6", "day_of_week": 0}, "Asia/Kolkata"),
    ],
)
def test_celery_crontab_fires_at_the_same_times(fields: dict[str, Any], zone: str) -> None:
    entry = crontab(app=celery_app(zone), **fields)
    schedule = beat.schedule_of(entry)
    assert schedule["tz"] == zone
    expected: list[datetime] = []
    last = START.astimezone(ZoneInfo(zone))
    for _ in range(FIRINGS):
        start, delta, _now = entry.remaining_delta(last)
        last = start + delta
        expected.append(last.astimezone(UTC))
    assert sidecar_firings(schedule["cron"], schedule["tz"]) == expected, schedule


def test_celery_interval_is_every() -> None:
    assert beat.schedule_of(every(timedelta(seconds=30))) == {"every": timedelta(seconds=30)}


def test_celery_schedules_cron_cannot_say_are_refused() -> None:
    app = celery_app("UTC")
    with pytest.raises(beat.UnsupportedSchedule, match="both day_of_month and day_of_week"):
        beat.schedule_of(crontab(day_of_month=1, day_of_week="mon", app=app))
    with pytest.raises(beat.UnsupportedSchedule, match="no gated schedule"):
        # A schedule of its own kind (as `solar` is): the sidecar cannot compute its slots.
        beat.schedule_of(BaseSchedule(app=app))


def test_celery_entry_names_become_task_names() -> None:
    assert beat.task_name("add every 10 seconds") == "add-every-10-seconds"
    assert beat.task_name("reports.nightly") == "reports.nightly"
    with pytest.raises(beat.UnsupportedSchedule):
        beat.task_name("!!!")


def test_a_job_that_cannot_be_gated_never_runs(caplog: pytest.LogCaptureFixture) -> None:
    # Refused in the scheduler's thread before anything is asked: no sidecar needed.
    executor = aps.LeaseholdExecutor(Client(f"http://127.0.0.1:{free_port()}", timeout=1))
    scheduler = BackgroundScheduler(executors={"default": executor})
    ran = threading.Event()
    when = datetime.now(UTC) + timedelta(seconds=0.2)
    scheduler.add_job(ran.set, "date", run_date=when, id="one-off")
    scheduler.add_job(ran.set, "cron", day="last", id="month-end", next_run_time=when)
    with caplog.at_level(logging.ERROR, logger="apscheduler"):
        scheduler.start()
        time.sleep(1)
        scheduler.shutdown()
    assert not ran.is_set()
    refused = [r for r in caplog.records if r.exc_info and r.exc_info[0] is aps.UnsupportedTrigger]
    messages = sorted(r.getMessage() for r in refused)
    assert len(messages) == 2, messages
    assert "trigger: cron[day='last']" in messages[0]
    assert "trigger: date[" in messages[1]
