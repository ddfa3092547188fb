"""The sidecar's JSON answers about the fleet, as it sends them
(crates/leasehold-serve/openapi.json).

Times are milliseconds (`*_ms`; slots and `at_ms` since the epoch, on the store's clock); tokens
are decimal strings here, as in the API.
"""

from __future__ import annotations

from typing import Literal, TypedDict


class Pause(TypedDict, total=False):
    """Who paused a task, when and why (`reason` only if they said)."""

    by: str
    reason: str
    at_ms: int


class TriggerRequest(TypedDict):
    """A manual run asked for; its history entry carries `id` in `request.id`."""

    id: str
    by: str
    at_ms: int
    expires_ms: int


class TaskDefinition(TypedDict):
    """A task as the instance that registered it last wrote it."""

    source: str
    schedule: str
    time_zone: str | None
    on_store_down: str
    catch_up: str | None
    gated: bool
    leader_group: str | None
    spread_group: str | None


class TaskInstance(TypedDict):
    instance: str
    live: bool
    remaining_ms: int
    version: str | None
    host: str | None
    pid: int | None


class RunRequest(TypedDict):
    id: str
    by: str


class Missed(TypedDict):
    count: int
    last_slot_ms: int
    reason: str


class RunEntry(TypedDict):
    """One history entry: a run, or slots that did not run (`outcome` `missed`)."""

    slot_ms: int | None
    trigger: str | None
    holder: str
    token: str | None
    started_ms: int | None
    ended_ms: int | None
    duration_ms: int | None
    outcome: str
    error: str | None
    paused: Pause | None
    request: RunRequest | None
    missed: Missed | None
    #: What the run printed, as its job kept it (`done`'s `output`): untrusted text.
    output: str | None


class Miss(TypedDict):
    slot_ms: int
    count: int
    last_slot_ms: int
    reason: str


class HeldLease(TypedDict):
    holder: str
    token: str
    remaining_ms: int


TaskState = Literal["running", "paused", "no_instance", "failing", "idle"]


class TaskSummary(TypedDict):
    """A task in the store's catalog."""

    name: str
    state: TaskState
    definition: TaskDefinition | None
    paused: Pause | None
    trigger: TriggerRequest | None
    instances: list[TaskInstance]
    lease: HeldLease | None
    last_run: RunEntry | None
    next_slot_ms: int | None
    missed_24h: int
    consecutive_failures: int
    last_success_ms: int | None


class TaskDetail(TaskSummary):
    """A task with the store's clock, its history (newest first) and recent misses."""

    now_ms: int
    history: list[RunEntry]
    missed: list[Miss]


class TaskList(TypedDict):
    now_ms: int
    tasks: list[TaskSummary]


class LeaseEntry(TypedDict):
    name: str
    holder: str | None
    token: str | None
    remaining_ms: int | None


class LeaseList(TypedDict):
    now_ms: int
    leases: list[LeaseEntry]


class LeaseState(TypedDict):
    name: str
    held: bool
    holder: str | None
    token: str | None
    remaining_ms: int


class GroupState(TypedDict):
    """A group's leader (None: nobody leads) and its term's token."""

    group: str
    leader: str | None
    token: str | None
    remaining_ms: int


class Health(TypedDict, total=False):
    status: str
    store: str
    store_reachable: bool | None
    held: int
