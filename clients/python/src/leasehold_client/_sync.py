"""The sync client: leases and runs kept by a background thread each."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, Literal, Self, Unpack, cast

import httpx

from . import _held
from . import _protocol as protocol
from ._errors import LeaseBusy, LeaseholdError, LeaseLost, SidecarDown, StoreDown
from ._held import GateResult, Skipped, TakeOptions, TickOptions
from ._protocol import Grant, Outcome, Seconds, SidecarDownPolicy
from ._types import (
    GroupState,
    Health,
    LeaseList,
    LeaseState,
    TaskDetail,
    TaskList,
    TaskSummary,
    TriggerRequest,
)

log = logging.getLogger("leasehold_client")


class _Kept(_held.HeldState):
    """A grant kept alive by a thread of `watch` long-polls, which are also the keepalives the
    sidecar requires: a frozen process stops calling and loses the lease within `keepalive`."""

    def __init__(self, client: Client, grant: Grant, sent_at: float) -> None:
        super().__init__(grant, sent_at)
        self._client = client
        self._lock = threading.Lock()
        #: Set the moment the lease is lost: the sidecar said so, or the validity it last
        #: granted ran out without a renewal (sidecar unreachable, this process paused).
        self.lost = threading.Event()
        self._stop = threading.Event()
        self._keeper = threading.Thread(
            target=self._keep, name=f"leasehold-keep:{grant.name}", daemon=True
        )
        self._keeper.start()

    def keepalive(self) -> float:
        """Tells the sidecar now that this process is alive (the keeper thread does so on its
        own) and answers the seconds it may still act. Raises `LeaseLost` if it is not held."""
        sent_at = time.monotonic()
        with self._lost_ends_it():
            body = self._client._send(protocol.keepalive(self.name, self.token))
        self._renewed(sent_at, body)
        return self.valid_for

    def _lose(self, reason: str) -> bool:
        with self._lock:
            if self._ended:
                return False
            self._ended = True
            self.lost_reason = reason
        self._stop.set()
        self.lost.set()
        log.warning("lease %s lost: %s", self.name, reason)
        return True

    def _end(self, how: str) -> bool:
        """Stops keeping the lease, here (`how`: released, done); False if it had ended
        already (by a loss)."""
        with self._lock:
            if not self._mark_ended(how):
                return False
        self._stop.set()
        return True

    def _keep(self) -> None:
        wait = self._watch_wait()
        while not self._stop.is_set():
            sent_at = time.monotonic()
            if (left := self._left_or_lose(sent_at)) is None:
                return
            try:
                body = self._client._send(protocol.watch(self.name, self.token, wait), limit=left)
            except LeaseLost as e:
                if not self._stop.is_set():
                    self._lose(e.reason or "unknown")
                return
            except Exception:
                # Unreachable, slow, or the client closed: the validity decides; ask again
                # shortly, but not past it.
                pause = min(0.2, wait, max(0.0, self._valid_until - time.monotonic()))
                if self._stop.wait(pause):
                    return
                continue
            if self._stop.is_set():
                return
            self._renewed(sent_at, body)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lost = self._lost_in_block()
        self._finish(exc)
        if lost and exc is None:
            raise self._lost_error()

    def _finish(self, failure: BaseException | None) -> None:
        """Ends the lease at the block's end; `failure`: what ended the block, if anything."""
        raise NotImplementedError

    def _lost_in_block(self) -> bool:
        """Whether the lease was lost while the guarded block ran (checked at its end)."""
        self._expire_if_due()
        return self.lost.is_set()


class Lease(_Kept):
    """A lease held through the sidecar. As a context manager it is released at the end of the
    block, and the block's end raises `LeaseLost` if the lease was lost meanwhile."""

    def release(self) -> bool:
        """Stops keeping the lease and frees it, so that another instance takes it at once.
        False when it was no longer held. Raises `SidecarDown` when the sidecar cannot be
        reached (the lease then ends by itself within `keepalive`)."""
        if not self._end("released") and self.lost_reason is None:
            return False
        body = self._client._send(protocol.release(self.name, self.token))
        return body.get("released") is True

    def _finish(self, failure: BaseException | None) -> None:
        try:
            self.release()
        except LeaseholdError as e:
            log.warning("lease %s not released: %s", self.name, e)


class Run(_Kept, _held.RunInfo):
    """A run granted by a tick: the one run of `slot` across every sidecar on the store. It holds
    the task's lease until `done`. As a context manager, the block's end calls `done` with `ok`,
    or `failed` and the exception's text, and raises `LeaseLost` if the run was lost meanwhile."""

    gated: Literal[True] = True

    def __init__(
        self,
        client: Client,
        task: str,
        slot: int,
        answer: protocol.TickAnswer,
        grant: Grant,
        sent_at: float,
    ) -> None:
        super().__init__(client, grant, sent_at)
        self._run_of(task, slot, answer)

    def done(
        self, outcome: Outcome = "ok", error: str | None = None, output: str | None = None
    ) -> bool:
        """Ends the run: records its outcome in the task's history and frees the task lease.
        `output`: what the run printed, kept in its record (its last 64 KiB; shown by
        `leasehold history --output` and the page). False when the run had been lost (the
        history then says so) or was reported already."""
        if not self._first_report():
            return False
        self._end("done")
        try:
            body = self._client._send(
                protocol.done(self.task, self.slot, self.token, outcome, error, output)
            )
        except LeaseLost:
            return False
        return body.get("released") is True

    def _finish(self, failure: BaseException | None) -> None:
        try:
            if failure is None:
                self.done("ok")
            else:
                self.done("failed", protocol.failure_text(failure))
        except LeaseholdError as e:
            log.warning("run %s of %s not reported: %s", self.slot, self.task, e)


class UngatedRun(_held.UngatedInfo):
    def __init__(self, task: str, slot: int | None) -> None:
        super().__init__(task, slot)
        self.lost = threading.Event()

    def done(
        self, outcome: Outcome = "ok", error: str | None = None, output: str | None = None
    ) -> bool:
        """Nothing to report: answers False."""
        return False

    def __enter__(self) -> UngatedRun:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class Client:
    """The sidecar's client. `base_url` defaults to `$LEASEHOLD_SIDECAR`, else
    `http://127.0.0.1:7070`; `auth_token` is sent as `Authorization: Bearer` (a sidecar run with
    `--auth-token-file`). A request the sidecar has not answered within `timeout` seconds (on top
    of any wait asked for) fails as `SidecarDown`, like a refused connection.
    `on_sidecar_down` is what `gate` does then: `fail-closed` (default) does not run the job,
    `fail-open` runs it ungated on this instance. Thread-safe; close it (or use `with`) to free
    its connections."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        auth_token: str | None = None,
        timeout: float = 10.0,
        on_sidecar_down: SidecarDownPolicy = "fail-closed",
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = protocol.base_url(base_url)
        self.timeout = timeout
        self.on_sidecar_down: SidecarDownPolicy = on_sidecar_down
        headers = {"authorization": f"Bearer {auth_token}"} if auth_token else {}
        self._http = httpx.Client(
            base_url=self.base_url, headers=headers, timeout=timeout, transport=transport
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, call: protocol.Call, limit: float | None = None) -> dict[str, Any]:
        """One request; `limit` caps its timeout (seconds)."""
        timeout = protocol.timeout(call, self.timeout, limit)
        try:
            response = self._http.request(call.method, call.path, json=call.body, timeout=timeout)
        except httpx.HTTPError as e:
            raise protocol.unreachable(self.base_url, timeout, e) from None
        return protocol.answer(response.status_code, response.text)

    def health(self) -> Health:
        """The sidecar's liveness, and whether its store answered lately."""
        return cast(Health, self._send(protocol.get("/healthz")))

    def acquire(self, name: str, **options: Unpack[TakeOptions]) -> Lease | None:
        """Takes the lease `name`, waiting up to `wait` for a busy one; None when it stays
        busy. `ttl`: the lease's time to live in the store (the sidecar renews it while this
        client keeps calling, at least once per `keepalive`, default the ttl). `holder`: a label
        for status, e.g. the pod name."""
        return self._take_or_none("leases", name, options)

    def lease(self, name: str, **options: Unpack[TakeOptions]) -> Lease:
        """As `acquire`, but raises `LeaseBusy` when busy: `with client.lease(...) as lease:`."""
        return self._take_or_raise("leases", name, options)

    def campaign(self, group: str, **options: Unpack[TakeOptions]) -> Lease | None:
        """Becomes the leader of `group` (a lease named after it), waiting up to `wait`; None
        when another leads. Release the lease to step down."""
        return self._take_or_none("groups", group, options)

    def leadership(self, group: str, **options: Unpack[TakeOptions]) -> Lease:
        """As `campaign`, but raises `LeaseBusy` when another leads."""
        return self._take_or_raise("groups", group, options)

    def _take(
        self, kind: Literal["leases", "groups"], name: str, options: TakeOptions
    ) -> Lease | LeaseBusy:
        sent_at = time.monotonic()
        body = self._send(_held.take_call(kind, name, options))
        grant = protocol.granted(name, body)
        return protocol.busy(name, body) if grant is None else Lease(self, grant, sent_at)

    def _take_or_none(
        self, kind: Literal["leases", "groups"], name: str, options: TakeOptions
    ) -> Lease | None:
        taken = self._take(kind, name, options)
        return None if isinstance(taken, LeaseBusy) else taken

    def _take_or_raise(
        self, kind: Literal["leases", "groups"], name: str, options: TakeOptions
    ) -> Lease:
        taken = self._take(kind, name, options)
        if isinstance(taken, LeaseBusy):
            raise taken
        return taken

    def leader(self, group: str) -> GroupState:
        """The group's current leader and term token."""
        return cast(GroupState, self._send(protocol.get(f"/v1/groups/{protocol.segment(group)}")))

    def observe(self, group: str, token: int | str | None = None, wait: Seconds = 30) -> GroupState:
        """Waits (up to `wait`) until the group's term differs from `token` (None: nobody
        leads), then answers the group's state. Loop on it to follow the leadership."""
        return cast(GroupState, self._send(protocol.observe(group, token, wait)))

    def tick(self, task: str, **options: Unpack[TickOptions]) -> Run | UngatedRun | Skipped:
        """The gated tick: call it from your own timer. A `Run` on exactly one caller per slot
        of the task, across every sidecar on the store; otherwise `Skipped` with the reason
        (or an `UngatedRun` when the store is down and its policy runs anyway)."""
        sent_at = time.monotonic()
        answer = protocol.ticked(task, self._send(_held.tick_call(task, options)))
        if (wait := _held.early_wait(answer)) is not None:
            # Ticked a little before the slot by the store's clock: wait for it, tick again.
            time.sleep(wait)
            sent_at = time.monotonic()
            answer = protocol.ticked(task, self._send(_held.tick_call(task, options)))
        if answer.grant is not None and answer.slot is not None:
            return Run(self, task, answer.slot, answer, answer.grant, sent_at)
        if answer.ungated:
            return UngatedRun(task, answer.slot)
        return Skipped(task, answer.slot, answer.reason or "not-due")

    def gate(
        self,
        task: str,
        job: Callable[[Run | UngatedRun], object],
        **options: Unpack[TickOptions],
    ) -> GateResult:
        """Ticks, and if this caller runs the slot, calls `job(run)` and ends the run with the
        job's outcome (`failed` with the exception's text if it raised). Answers `ran`,
        `failed` (the job raised, or the run was lost while it ran), or why it did not run. A
        `busy` answer is asked again (4 times, 100 ms apart). When the sidecar cannot be
        reached, `on_sidecar_down` decides. Other errors raise."""
        try:
            run = self.tick(task, **options)
            for _ in range(protocol.BUSY_RETRIES):
                if not (isinstance(run, Skipped) and run.reason == "busy"):
                    break
                time.sleep(protocol.BUSY_RETRY_SECONDS)
                run = self.tick(task, **options)
        except (StoreDown, SidecarDown) as e:
            if (result := _held.unreached(e, self.on_sidecar_down)) is not None:
                return result
            run = UngatedRun(task, protocol.local_slot(options.get("every")))
        if isinstance(run, Skipped):
            return run.reason
        try:
            with run:
                job(run)
        except Exception as e:
            if isinstance(e, LeaseLost) and run.lost.is_set():
                log.warning("%s: the run of slot %s was lost: %s", task, run.slot, e.reason)
            else:
                log.warning("%s: the run of slot %s failed: %s", task, run.slot, e)
            return "failed"
        return "ran"

    def tasks(self) -> TaskList:
        """Every task in the store's catalog, with the store's clock."""
        return cast(TaskList, self._send(protocol.get("/v1/tasks")))

    def task(self, name: str, *, limit: int | None = None) -> TaskDetail:
        """One task with its newest `limit` history entries (default 50, at most 500) and its
        misses of the last 24 hours. Raises `UnknownTask`."""
        query = "" if limit is None else f"?limit={limit}"
        return cast(TaskDetail, self._send(protocol.get(protocol.task_path(name) + query)))

    def leases(self) -> LeaseList:
        """Lease records in the store: tasks' run leases, leader groups, applications' leases."""
        return cast(LeaseList, self._send(protocol.get("/v1/leases")))

    def lease_state(self, name: str) -> LeaseState:
        """The lease `name` as the store has it now."""
        return cast(LeaseState, self._send(protocol.get(f"/v1/leases/{protocol.segment(name)}")))

    def pause(self, name: str, *, reason: str | None = None, by: str | None = None) -> TaskSummary:
        """Pauses the task on every instance from their next tick (its slots are recorded as
        paused and never caught up; a run going finishes). Raises `UnknownTask`."""
        body = {"reason": reason, "by": by}
        call = protocol.Call("POST", protocol.task_path(name, "/pause"), body)
        return cast(TaskSummary, self._send(call))

    def resume(self, name: str) -> TaskSummary:
        """Lifts the task's pause: its next slot runs."""
        call = protocol.Call("POST", protocol.task_path(name, "/resume"), {})
        return cast(TaskSummary, self._send(call))

    def trigger(self, name: str, *, by: str | None = None) -> TriggerRequest:
        """Asks whichever instance runs the task to run it once, at its next tick; answers the
        request, whose `id` the run's history entry carries. Raises `NoInstance` when no
        instance runs it, `UnknownTask`."""
        call = protocol.Call("POST", protocol.task_path(name, "/trigger"), {"by": by})
        return cast(TriggerRequest, self._send(call))
