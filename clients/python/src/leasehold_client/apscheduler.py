"""APScheduler 3: every job of a scheduler fires on one replica per slot.

Give the scheduler a `LeaseholdExecutor`; each replica keeps its own scheduler with the same jobs,
and each firing asks the sidecar first, with the job's own trigger as the schedule (the task is
the job's id)::

    scheduler = BackgroundScheduler(executors={"default": LeaseholdExecutor(Client())})
    scheduler.add_job(expire_gigs, "cron", minute="*/5", id="expire-gigs")

The job runs if this replica wins the slot, holding the task's lease (its fencing token is
`current_run().token` inside the job); the others skip that firing. Interval triggers become
slots at every multiple of the interval since the Unix epoch (each replica's own timer fires once
per interval, and the first tick in each slot runs it); cron triggers become the same cron
expression in the trigger's time zone. Other triggers (date, calendar interval, combined) are
refused: the job is then not run, and APScheduler logs the error at each firing.
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any

from apscheduler.executors.base import run_job
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.job import Job
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.cron.expressions import AllExpression, RangeExpression
from apscheduler.triggers.interval import IntervalTrigger

from ._held import TickOptions
from ._protocol import Seconds, StoreDownPolicy
from ._sync import Client, Run, UngatedRun

__all__ = ["LeaseholdExecutor", "UnsupportedTrigger", "current_run", "schedule_of"]

log = logging.getLogger("leasehold_client.apscheduler")

_current_run: ContextVar[Run | UngatedRun | None] = ContextVar("leasehold_run", default=None)

# APScheduler numbers weekdays from Monday (0); cron from Sunday. Names mean the same in both.
_WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
#: The cron fields, in leasehold's six-field order (seconds first).
_CRON_FIELDS = ("second", "minute", "hour", "day", "month", "day_of_week")


class UnsupportedTrigger(ValueError):
    """A trigger that has no schedule the sidecar knows: the job is not run."""


def current_run() -> Run | UngatedRun | None:
    """The run the current job executes under (its `token` to fence writes with, its `slot`,
    `check()`), or None outside a job run by a `LeaseholdExecutor`."""
    return _current_run.get()


def schedule_of(trigger: object) -> TickOptions:
    """The sidecar schedule of an APScheduler trigger: `every` for an `IntervalTrigger`, `cron`
    and `tz` for a `CronTrigger`. Raises `UnsupportedTrigger` for any other trigger, and for
    cron triggers that cron cannot say (a year or week, `last`, `2nd fri`, a day of the month
    together with days of the week, which APScheduler requires both of and cron either of)."""
    if isinstance(trigger, IntervalTrigger):
        interval: timedelta = trigger.interval
        return {"every": interval}
    if isinstance(trigger, CronTrigger):
        return {"cron": _cron_expression(trigger), "tz": _zone_name(trigger.timezone)}
    raise UnsupportedTrigger(
        f"{trigger!r} has no gated schedule: use an interval or a cron trigger "
        "(a one-off date job can take a lease instead: client.lease(...))"
    )


def _cron_expression(trigger: CronTrigger) -> str:
    fields = {field.name: field for field in trigger.fields}
    for name in ("year", "week"):
        if str(fields[name]) != "*":
            raise UnsupportedTrigger(f"{trigger!r}: cron has no {name} field")
    if str(fields["day"]) != "*" and str(fields["day_of_week"]) != "*":
        raise UnsupportedTrigger(
            f"{trigger!r}: APScheduler runs only on days that match both day and day_of_week, "
            "cron on days that match either; give one of them"
        )
    parts = []
    for name in _CRON_FIELDS:
        field = fields[name]
        if name == "day_of_week":
            parts.append(_weekdays(trigger, field))
            continue
        for expression in field.expressions:
            # Plain numbers, ranges, steps and month names read the same in cron.
            if type(expression) not in (AllExpression, RangeExpression) and name != "month":
                raise UnsupportedTrigger(f"{trigger!r}: cron cannot say {name}={field}")
        parts.append(str(field))
    return " ".join(parts)


def _weekdays(trigger: CronTrigger, field: Any) -> str:
    """The field's days as cron names (APScheduler's numbers start on Monday, cron's on
    Sunday)."""
    if str(field) == "*":
        return "*"
    days: set[int] = set()
    for expression in field.expressions:
        if not isinstance(expression, AllExpression | RangeExpression):
            raise UnsupportedTrigger(f"{trigger!r}: cron cannot say day_of_week={field}")
        # AllExpression (`*/2`) spans the week; a range with a step but no end runs to Sunday.
        last = getattr(expression, "last", None)
        start, end = getattr(expression, "first", 0), 6 if last is None else last
        days.update(range(start, end + 1, expression.step or 1))
    return ",".join(_WEEKDAYS[day] for day in sorted(days))


def _zone_name(zone: tzinfo) -> str:
    name = getattr(zone, "key", None) or getattr(zone, "zone", None)
    if isinstance(name, str):
        return name
    if zone is UTC or str(zone) == "UTC":
        return "UTC"
    raise UnsupportedTrigger(f"the time zone {zone!r} has no IANA name: give a zoneinfo zone")


class LeaseholdExecutor(ThreadPoolExecutor):
    """A thread-pool executor whose jobs run on one replica per slot (see the module).

    `client`: this replica's sidecar. `ttl`: the task lease's ttl while a job runs (default 30 s;
    a replica killed mid-run blocks the task for at most this long). `keepalive`: as for a
    lease. `on_store_down`: the sidecar's `--on-store-down` unless given. `task_prefix` is put
    before each job id to name its task. When the sidecar cannot be reached, the client's
    `on_sidecar_down` decides (fail-closed by default: the firing is skipped).
    """

    def __init__(
        self,
        client: Client,
        *,
        ttl: Seconds = 30,
        keepalive: Seconds | None = None,
        on_store_down: StoreDownPolicy | None = None,
        task_prefix: str = "",
        max_workers: int = 10,
        pool_kwargs: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(max_workers, pool_kwargs)
        self._client = client
        self._policies: TickOptions = {"ttl": ttl}
        if keepalive is not None:
            self._policies["keepalive"] = keepalive
        if on_store_down is not None:
            self._policies["on_store_down"] = on_store_down
        self._task_prefix = task_prefix

    def _do_submit_job(self, job: Job, run_times: list[datetime]) -> None:
        # Refused here, in the scheduler's thread, so a job that cannot be gated never runs.
        options: TickOptions = {**schedule_of(job.trigger), **self._policies}
        task = self._task_prefix + job.id

        def finished(future: Any) -> None:
            error = future.exception()
            if error is not None:
                self._run_job_error(job.id, error, error.__traceback__)
            else:
                self._run_job_success(job.id, future.result())

        self._pool.submit(self._run_gated, job, task, options, run_times).add_done_callback(
            finished
        )

    def _run_gated(
        self, job: Job, task: str, options: TickOptions, run_times: list[datetime]
    ) -> list[Any]:
        latest = run_times[-1:]
        grace = job.misfire_grace_time
        if grace is not None and datetime.now(UTC) - latest[0] > timedelta(seconds=grace):
            # Too late to run: APScheduler reports the miss; nothing to ask the sidecar.
            return list(run_job(job, job._jobstore_alias, latest, self._logger.name))
        events: list[Any] = []

        def run(gated: Run | UngatedRun) -> None:
            token = _current_run.set(gated)
            try:
                events.extend(run_job(job, job._jobstore_alias, latest, self._logger.name))
            finally:
                _current_run.reset(token)
            failure = next((e.exception for e in events if e.exception is not None), None)
            if isinstance(failure, Exception):
                raise failure
            if failure is not None:
                raise RuntimeError(f"the job ended with {failure!r}")

        result = self._client.gate(task, run, **options)
        if result in ("sidecar-down", "store-down"):
            log.warning("%s: not run (%s)", task, result)
        elif result not in ("ran", "failed"):
            log.debug("%s: not run here (%s)", task, result)
        return events
