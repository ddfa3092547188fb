"""Celery beat: each periodic task is sent once per slot, however many beats run.

Run a beat beside each replica (each with its own sidecar) with this scheduler::

    app.conf.beat_scheduler = "leasehold_client.celery:LeaseholdScheduler"
    app.conf.leasehold_sidecar = "http://127.0.0.1:7070"   # default: $LEASEHOLD_SIDECAR

When an entry of `beat_schedule` is due, the beat asks its sidecar with the entry's own schedule
(the task is the entry's name); the beat that wins the slot sends the task, the others skip
that firing. The message carries the slot and the fencing token in its headers
(`beat_slot(self.request)` in a bound task). Interval entries become slots at every multiple of
the interval since the Unix epoch; `crontab` entries the same cron expression in the app's
time zone. `solar` entries and crontabs with both a day of the month and days of the week
(Celery requires both, cron either) are refused: the entry is not sent, and the beat logs why.

What is gated is the sending: the run is recorded in the task's history (`leasehold history`)
when the broker has taken the message. Settings (`app.conf`): `leasehold_sidecar`,
`leasehold_auth_token`, `leasehold_ttl` (seconds, default 30), `leasehold_on_sidecar_down`
(`fail-closed`, the default: nothing is sent while this beat's sidecar is unreachable; the
other beats still send).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import tzinfo
from typing import Any

from celery.beat import PersistentScheduler, ScheduleEntry
from celery.schedules import crontab
from celery.schedules import schedule as every_schedule

from ._held import TickOptions
from ._sync import Client, Run, UngatedRun

__all__ = ["BeatSlot", "LeaseholdScheduler", "UnsupportedSchedule", "beat_slot", "schedule_of"]

log = logging.getLogger("leasehold_client.celery")

SLOT_HEADER = "leasehold_slot"
TOKEN_HEADER = "leasehold_token"
_NOT_IN_NAMES = re.compile(r"[^A-Za-z0-9._:/-]+")


class UnsupportedSchedule(ValueError):
    """A beat schedule that has no schedule the sidecar knows: the entry is not sent."""


@dataclass(frozen=True)
class BeatSlot:
    """The slot a beat sent a task for (ms since the epoch) and the run's fencing token (None
    for a run the store-down policy let through ungated)."""

    slot: int
    token: int | None


def beat_slot(request: Any) -> BeatSlot | None:
    """The slot and token of a task sent by a `LeaseholdScheduler` (`self.request` of a bound
    task); None for a task sent otherwise."""
    slot = getattr(request, SLOT_HEADER, None)
    if slot is None:
        return None
    token = getattr(request, TOKEN_HEADER, None)
    return BeatSlot(int(slot), None if token is None else int(token))


def task_name(entry_name: str) -> str:
    """The task an entry runs as: its name, with each run of characters a task name cannot
    hold (spaces, say) as one `-`."""
    name = _NOT_IN_NAMES.sub("-", entry_name).strip("-")[:128]
    if not name:
        raise UnsupportedSchedule(f"the beat entry {entry_name!r} has no usable name")
    return name


def schedule_of(entry_schedule: object) -> TickOptions:
    """The sidecar schedule of a beat entry's schedule: `every` for an interval, `cron` and
    `tz` for a `crontab`. Raises `UnsupportedSchedule` otherwise."""
    if isinstance(entry_schedule, crontab):
        fields = [
            entry_schedule._orig_minute,
            entry_schedule._orig_hour,
            entry_schedule._orig_day_of_month,
            entry_schedule._orig_month_of_year,
            entry_schedule._orig_day_of_week,
        ]
        minute, hour, day_of_month, month, day_of_week = (str(f) for f in fields)
        if day_of_month != "*" and day_of_week != "*":
            raise UnsupportedSchedule(
                f"{entry_schedule!r}: Celery runs only on days that match both day_of_month and "
                "day_of_week, cron on days that match either; give one of them"
            )
        zone: tzinfo = entry_schedule.tz
        return {
            "cron": f"{minute} {hour} {day_of_month} {month} {day_of_week}",
            "tz": _zone_name(zone),
        }
    if isinstance(entry_schedule, every_schedule):
        return {"every": entry_schedule.run_every}
    raise UnsupportedSchedule(
        f"{entry_schedule!r} has no gated schedule: use an interval or a crontab"
    )


def _zone_name(zone: tzinfo) -> str:
    name = getattr(zone, "key", None) or getattr(zone, "zone", None)
    if isinstance(name, str):
        return name
    if str(zone) == "UTC":
        return "UTC"
    raise UnsupportedSchedule(f"the time zone {zone!r} has no IANA name: set app.conf.timezone")


class LeaseholdScheduler(PersistentScheduler):
    """Celery beat's default scheduler (its schedule file included), sending each due entry
    only if this beat wins the entry's slot (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        conf = self.app.conf
        self._client = Client(
            conf.get("leasehold_sidecar"),
            auth_token=conf.get("leasehold_auth_token"),
            on_sidecar_down=conf.get("leasehold_on_sidecar_down", "fail-closed"),
        )
        self._ttl = conf.get("leasehold_ttl", 30)
        self._entries_of: dict[str, str] = {}

    def apply_entry(self, entry: ScheduleEntry, producer: Any = None) -> None:
        try:
            task = task_name(entry.name)
            options: TickOptions = {**schedule_of(entry.schedule), "ttl": self._ttl}
        except UnsupportedSchedule as e:
            log.error("beat entry %r not sent: %s", entry.name, e)
            return
        other = self._entries_of.setdefault(task, entry.name)
        if other != entry.name:
            log.error(
                "beat entries %r and %r would share the task %s: not sent; rename one",
                other,
                entry.name,
                task,
            )
            return

        def send(run: Run | UngatedRun) -> None:
            headers = dict(entry.options.get("headers") or {})
            headers[SLOT_HEADER] = run.slot
            headers[TOKEN_HEADER] = None if run.token is None else str(run.token)
            gated = ScheduleEntry(
                **{**dict(entry), "options": {**entry.options, "headers": headers}}
            )
            self.apply_async(gated, producer=producer, advance=False)
            log.info("Scheduler: sent %s (%s) for slot %s", entry.name, entry.task, run.slot)

        result = self._client.gate(task, send, **options)
        if result in ("sidecar-down", "store-down"):
            log.warning("beat entry %r not sent: %s", entry.name, result)
        elif result != "ran":
            log.debug("beat entry %r not sent by this beat: %s", entry.name, result)

    def close(self) -> None:
        super().close()
        self._client.close()
