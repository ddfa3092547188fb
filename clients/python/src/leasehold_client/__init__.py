"""Client for the leasehold sidecar (`leasehold serve`): leases with fencing tokens, group
leadership, gated ticks that run on exactly one instance per slot, and the fleet's tasks and
control, over the sidecar's HTTP API. `Client` is sync (a thread keeps each lease), `AsyncClient`
asyncio (a task keeps each lease, and a loss cancels the task running the guarded block).
Integrations: `leasehold_client.apscheduler` (APScheduler 3) and `leasehold_client.celery`
(Celery beat)."""

from ._async import AsyncClient, AsyncLease, AsyncRun, AsyncUngatedRun
from ._errors import (
    BadAnswer,
    BadRequest,
    LeaseBusy,
    LeaseholdError,
    LeaseLost,
    NoCatalog,
    NoInstance,
    SidecarDown,
    StoreDown,
    StoreRefused,
    Unauthorized,
    UnknownTask,
)
from ._held import GateResult, Skipped, TakeOptions, TickOptions
from ._protocol import Outcome, Seconds, SidecarDownPolicy, SkipReason, StoreDownPolicy
from ._sync import Client, Lease, Run, UngatedRun
from ._types import (
    GroupState,
    Health,
    HeldLease,
    LeaseEntry,
    LeaseList,
    LeaseState,
    Miss,
    Pause,
    RunEntry,
    TaskDefinition,
    TaskDetail,
    TaskInstance,
    TaskList,
    TaskSummary,
    TriggerRequest,
)

__version__ = "0.2.0"

__all__ = [
    "AsyncClient",
    "AsyncLease",
    "AsyncRun",
    "AsyncUngatedRun",
    "BadAnswer",
    "BadRequest",
    "Client",
    "GateResult",
    "GroupState",
    "Health",
    "HeldLease",
    "Lease",
    "LeaseBusy",
    "LeaseEntry",
    "LeaseList",
    "LeaseLost",
    "LeaseState",
    "LeaseholdError",
    "Miss",
    "NoCatalog",
    "NoInstance",
    "Outcome",
    "Pause",
    "Run",
    "RunEntry",
    "Seconds",
    "SidecarDown",
    "SidecarDownPolicy",
    "SkipReason",
    "Skipped",
    "StoreDown",
    "StoreDownPolicy",
    "StoreRefused",
    "TakeOptions",
    "TaskDefinition",
    "TaskDetail",
    "TaskInstance",
    "TaskList",
    "TaskSummary",
    "TickOptions",
    "TriggerRequest",
    "Unauthorized",
    "UngatedRun",
    "UnknownTask",
    "__version__",
]
