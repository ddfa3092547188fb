"""What a held lease or run knows, for the sync and the asyncio client alike: its grant, and for
how long it may still act by this host's monotonic clock."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, Required, TypedDict

from . import _protocol as protocol
from ._errors import LeaseLost, SidecarDown, StoreDown
from ._protocol import (
    Grant,
    Seconds,
    SidecarDownPolicy,
    SkipReason,
    StoreDownPolicy,
    Trigger,
)


class TickOptions(TypedDict, total=False):
    """A tick's schedule and policies.

    `every` (seconds or a timedelta: slots at every multiple of it since the Unix epoch) or
    `cron` (five fields as in crontab, six with seconds first, or a macro such as `@daily`)
    with `tz`, an IANA zone (default UTC). `group`: run only on the group's leader. `ttl` (the
    task lease's, default 30 s) and `keepalive` (default the ttl) as for a lease.
    `on_store_down`: the sidecar's `--on-store-down` unless given. `catch_up_window`: how long
    after its slot a task's first tick still runs it (as `catch-up`; default one hour).

    Run policies: `timeout` (each attempt's time limit: the run is then lost with reason
    `timed-out`); `retries` (0 to 100: a failed or timed-out attempt is offered again to a later
    tick whose slot already ran, as `trigger` `retry` with the next `attempt`, after
    `retry_backoff` doubling up to `retry_backoff_max`, never once the next slot has come);
    `overlap` (`skip`: a slot falling during a run answers busy; `allow`: it runs beside, under a
    run lease of its own); `jitter` (each slot's start put off by up to this much, the same on
    every instance); `on_interrupt` (`rerun`, the default: a run cut off, its caller silent or
    its sidecar gone, is run again once as attempt 2; `skip`: left). `history`: how many
    run-history entries the store keeps for the task (1 to 1000; default the sidecar's).
    """

    every: Seconds
    cron: str
    tz: str
    group: str
    ttl: Seconds
    keepalive: Seconds
    on_store_down: StoreDownPolicy
    catch_up_window: Seconds
    timeout: Seconds
    retries: int
    retry_backoff: Seconds
    retry_backoff_max: Seconds
    overlap: Literal["skip", "allow"]
    jitter: Seconds
    on_interrupt: Literal["rerun", "skip"]
    history: int


class TakeOptions(TypedDict, total=False):
    """A lease's (or a group leadership's) terms.

    `ttl`: the lease's time to live in the store (the sidecar renews it while the client keeps
    calling, at least once per `keepalive`, default the ttl). `wait`: how long to wait for a
    busy one (default 0). `holder`: a label for status, e.g. the pod name.
    """

    ttl: Required[Seconds]
    wait: Seconds
    keepalive: Seconds | None
    holder: str | None


def take_call(kind: Literal["leases", "groups"], name: str, options: TakeOptions) -> protocol.Call:
    # Keyword arguments: refused as a signature would refuse them.
    if unknown := options.keys() - TakeOptions.__optional_keys__ - TakeOptions.__required_keys__:
        raise TypeError(f"unexpected keyword argument {sorted(unknown)[0]!r}")
    if "ttl" not in options:
        raise TypeError("missing required keyword argument 'ttl'")
    return protocol.take(
        kind,
        name,
        options["ttl"],
        options.get("wait", 0),
        options.get("keepalive"),
        options.get("holder"),
    )


#: The longest wait for a slot about to start that a tick answered with `starts_in`.
EARLY_WAIT_LIMIT = 1.0


def early_wait(answer: protocol.TickAnswer) -> float | None:
    """How long to wait before ticking again when the tick came a little before its slot by
    the store's clock (`starts_in`, at most `EARLY_WAIT_LIMIT`); None: take the answer."""
    if answer.starts_in is not None and answer.starts_in <= EARLY_WAIT_LIMIT:
        return answer.starts_in
    return None


def tick_call(task: str, options: TickOptions) -> protocol.Call:
    return protocol.tick(
        task,
        options.get("every"),
        options.get("cron"),
        options.get("tz"),
        options.get("group"),
        options.get("ttl"),
        options.get("keepalive"),
        options.get("on_store_down"),
        options.get("catch_up_window"),
        protocol.RunPolicies(
            timeout=options.get("timeout"),
            retries=options.get("retries"),
            retry_backoff=options.get("retry_backoff"),
            retry_backoff_max=options.get("retry_backoff_max"),
            overlap=options.get("overlap"),
            jitter=options.get("jitter"),
            on_interrupt=options.get("on_interrupt"),
            history=options.get("history"),
        ),
    )


class HeldState:
    """A grant and its validity. The sidecar counts `valid_for` from when the request reached
    it, which is after it was sent: counting from the send is on the safe side."""

    def __init__(self, grant: Grant, sent_at: float) -> None:
        #: The lease's (or group's, or task's) name.
        self.name = grant.name
        #: The fencing token: send it with every write the lease protects.
        self.token = grant.token
        #: This grant's holder id ("" for a run).
        self.holder = grant.holder
        #: The sidecar drops the lease when this process has not called it for this long
        #: (seconds); the keeper calls it four times as often.
        self.keepalive_interval = grant.keepalive
        #: Why the lease was lost (`released`, `taken-over`, `expired`, `app-silent`,
        #: `timed-out`, `unknown`), or None while it is held or after it was ended here.
        self.lost_reason: str | None = None
        self._valid_until = sent_at + grant.valid_for
        self._ended = False
        #: How it ended here (`released`, `done`), for the error a check raises afterwards.
        self._ended_as = "expired"

    @property
    def valid_for(self) -> float:
        """Seconds this holder may still act, by the local clock; 0 once lost or ended."""
        if self._ended:
            return 0.0
        return max(0.0, self._valid_until - time.monotonic())

    def check(self) -> None:
        """Raises `LeaseLost` if the lease is lost or ended: call it before each step of the
        guarded work (and send `token` with each write, since a check cannot stop a write
        already on the wire). A paused process that wakes past the validity fails here at once,
        before anything else has run."""
        self._expire_if_due()
        if self._ended:
            raise self._lost_error()

    def _lose(self, reason: str) -> object:
        """Ends the lease as lost (`reason`), here and for the guarded work."""
        raise NotImplementedError

    def _expire_if_due(self) -> None:
        if self.valid_for <= 0 and not self._ended:
            self._lose("expired")

    def _left_or_lose(self, now: float) -> float | None:
        """Seconds of validity left at `now`; None once it ran out (the lease is then lost)."""
        left = self._valid_until - now
        if left <= 0:
            self._lose("expired")
            return None
        return left

    @contextmanager
    def _lost_ends_it(self) -> Iterator[None]:
        """Ends the lease here when the block raises `LeaseLost`, which goes on."""
        try:
            yield
        except LeaseLost as e:
            self._lose(e.reason or "unknown")
            raise

    def _mark_ended(self, how: str) -> bool:
        """Marks the lease ended here (`how`: released, done); False if it had ended already
        (by a loss)."""
        if self._ended:
            return False
        self._ended = True
        self._ended_as = how
        return True

    def _watch_wait(self) -> float:
        # The sidecar answers each watch within keepalive / 4: the next call reaches it long
        # before the validity granted by the previous answer runs out.
        return max(0.025, self.keepalive_interval / 4)

    def _renewed(self, sent_at: float, body: dict[str, Any]) -> None:
        valid_ms = body.get("valid_for_ms")
        if isinstance(valid_ms, int):
            self._valid_until = sent_at + valid_ms / 1000

    def _lost_error(self) -> LeaseLost:
        reason = self.lost_reason or self._ended_as
        return LeaseLost(
            f"lease {self.name} is not held: {reason}", code="lost", status=410, reason=reason
        )


class RunInfo:
    """What a gated run knows besides its grant: its task, its slot and what triggered it."""

    task: str
    #: The slot: ms since the epoch of the firing this run is for (a manual run: when it was
    #: asked for).
    slot: int
    #: `timer` for the schedule's slot, `catch-up` for a slot run late, `manual` for a run asked
    #: for with `trigger`, `retry` for a slot run again (`retries`, or a run cut off).
    trigger: Trigger
    #: Which attempt of the slot this is: 1, then 2, 3, ... for retries and re-runs.
    attempt: int
    _reported: bool

    def _run_of(self, task: str, slot: int, answer: protocol.TickAnswer) -> None:
        self.task = task
        self.slot = slot
        self.trigger = answer.trigger
        self.attempt = answer.attempt
        self._reported = False

    def _first_report(self) -> bool:
        """Whether this is the run's first `done` (a run reports once)."""
        if self._reported:
            return False
        self._reported = True
        return True


class UngatedInfo:
    """A run the store-down policy (or `on_sidecar_down="fail-open"`) allowed without
    coordination: no token, never lost, and every instance that ticks may run it."""

    gated: Literal[False] = False
    token: None = None

    def __init__(self, task: str, slot: int | None) -> None:
        self.task = task
        self.slot = slot
        self.trigger: Literal["timer"] = "timer"

    def check(self) -> None:
        """Never raises: nothing coordinated this run."""


@dataclass(frozen=True)
class Skipped:
    """A tick that does not run here: `reason` says why, `slot` which slot it was (None when
    the schedule has not fired yet). False in a boolean context, so `if run := client.tick(...)`
    reads as it should."""

    task: str
    slot: int | None
    reason: SkipReason

    def __bool__(self) -> Literal[False]:
        return False


#: What `gate` did: ran the job (`ran`, or `failed` when it raised), or why it did not.
GateResult = Literal[
    "ran",
    "failed",
    "not-leader",
    "already-run",
    "busy",
    "store-down",
    "not-due",
    "paused",
    "sidecar-down",
]


def unreached(error: StoreDown | SidecarDown, policy: SidecarDownPolicy) -> GateResult | None:
    """What `gate` answers when its tick got no decision (`error`): None when the job runs
    ungated here (the sidecar is down and `policy` is `fail-open`)."""
    if isinstance(error, StoreDown):
        return "store-down"
    return None if policy == "fail-open" else "sidecar-down"
