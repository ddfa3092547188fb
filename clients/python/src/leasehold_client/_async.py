"""The asyncio client: leases and runs kept by a task each; a loss cancels the task running the
guarded block."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Generator
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


class _AsyncKept(_held.HeldState):
    """A grant kept alive by a task of `watch` long-polls (the keepalives the sidecar requires).
    Inside `async with`, a loss cancels the task running the block; the block's end then
    raises `LeaseLost` instead of the `CancelledError`."""

    def __init__(self, client: AsyncClient, grant: Grant, sent_at: float) -> None:
        super().__init__(grant, sent_at)
        self._client = client
        #: Set the moment the lease is lost: the sidecar said so, or the validity it last
        #: granted ran out without a renewal (sidecar unreachable, this process paused).
        self.lost = asyncio.Event()
        self._guarded: asyncio.Task[Any] | None = None
        self._cancels_before = 0
        self._cancelled_guarded = False
        self._keeper = asyncio.create_task(self._keep(), name=f"leasehold-keep:{grant.name}")

    async def keepalive(self) -> float:
        """See `Lease.keepalive`."""
        sent_at = time.monotonic()
        with self._lost_ends_it():
            body = await self._client._send(protocol.keepalive(self.name, self.token))
        self._renewed(sent_at, body)
        return self.valid_for

    def _lose(self, reason: str) -> None:
        if self._ended:
            return
        self._ended = True
        self.lost_reason = reason
        self.lost.set()
        log.warning("lease %s lost: %s", self.name, reason)
        if asyncio.current_task() is not self._keeper:
            self._keeper.cancel()
        guarded = self._guarded
        # The guarded task itself (a check, the block's end) raises instead.
        if guarded is not None and not guarded.done() and guarded is not asyncio.current_task():
            self._cancelled_guarded = True
            guarded.cancel(f"lease {self.name} lost: {reason}")

    def _end(self, how: str) -> bool:
        """Stops keeping the lease, here (`how`: released, done); False if it had ended
        already (by a loss)."""
        if not self._mark_ended(how):
            return False
        self._keeper.cancel()
        return True

    async def _keep(self) -> None:
        wait = self._watch_wait()
        while not self._ended:
            sent_at = time.monotonic()
            if (left := self._left_or_lose(sent_at)) is None:
                return
            try:
                body = await self._client._send(
                    protocol.watch(self.name, self.token, wait), limit=left
                )
            except LeaseLost as e:
                self._lose(e.reason or "unknown")
                return
            except Exception:
                # Unreachable, slow, or the client closed: the validity decides; ask again
                # shortly, but not past it.
                await asyncio.sleep(min(0.2, wait, max(0.0, self._valid_until - time.monotonic())))
                continue
            if not self._ended:
                self._renewed(sent_at, body)

    def _enter_block(self) -> None:
        if self._guarded is not None:
            raise RuntimeError(f"lease {self.name} already guards a block")
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("async with a lease needs a running task")
        self._guarded = task
        self._cancels_before = task.cancelling()
        self.check()

    async def __aenter__(self) -> Self:
        self._enter_block()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lost = self._leave_block(exc)
        await self._finish(lost or exc)
        if lost is not None:
            raise lost from exc

    async def _finish(self, failure: BaseException | None) -> None:
        """Ends the lease at the block's end; `failure`: what ended the block, if anything."""
        raise NotImplementedError

    def _leave_block(self, exc: BaseException | None) -> LeaseLost | None:
        """The error the block's end raises: `LeaseLost` when the lease was lost while it ran
        (in place of the cancellation this caused, unless someone else cancelled too)."""
        task, self._guarded = self._guarded, None
        self._expire_if_due()
        if self._cancelled_guarded and task is not None:
            if task.uncancel() > self._cancels_before:
                return None
            if isinstance(exc, asyncio.CancelledError):
                return self._lost_error()
        if self.lost.is_set() and exc is None:
            return self._lost_error()
        return None


class AsyncLease(_AsyncKept):
    """A lease held through the sidecar; `async with lease:` releases it at the block's end."""

    async def release(self) -> bool:
        """Stops keeping the lease and frees it, so that another instance takes it at once.
        False when it was no longer held. Raises `SidecarDown` when the sidecar cannot be
        reached (the lease then ends by itself within `keepalive`)."""
        if not self._end("released") and self.lost_reason is None:
            return False
        body = await self._client._send(protocol.release(self.name, self.token))
        return body.get("released") is True

    async def _finish(self, failure: BaseException | None) -> None:
        try:
            await self.release()
        except LeaseholdError as e:
            log.warning("lease %s not released: %s", self.name, e)


class AsyncRun(_AsyncKept, _held.RunInfo):
    """A run granted by a tick (see `Run`); `async with run:` ends it with the block's outcome."""

    gated: Literal[True] = True

    def __init__(
        self,
        client: AsyncClient,
        task: str,
        slot: int,
        answer: protocol.TickAnswer,
        grant: Grant,
        sent_at: float,
    ) -> None:
        super().__init__(client, grant, sent_at)
        self._run_of(task, slot, answer)

    async def done(
        self, outcome: Outcome = "ok", error: str | None = None, output: str | None = None
    ) -> bool:
        """See `Run.done`."""
        if not self._first_report():
            return False
        self._end("done")
        try:
            body = await self._client._send(
                protocol.done(self.task, self.slot, self.token, outcome, error, output)
            )
        except LeaseLost:
            return False
        return body.get("released") is True

    async def _finish(self, failure: BaseException | None) -> None:
        try:
            if failure is None:
                await self.done("ok")
            else:
                await self.done("failed", protocol.failure_text(failure))
        except LeaseholdError as e:
            log.warning("run %s of %s not reported: %s", self.slot, self.task, e)


class AsyncUngatedRun(_held.UngatedInfo):
    def __init__(self, task: str, slot: int | None) -> None:
        super().__init__(task, slot)
        self.lost = asyncio.Event()

    async def done(
        self, outcome: Outcome = "ok", error: str | None = None, output: str | None = None
    ) -> bool:
        """Nothing to report: answers False."""
        return False

    async def __aenter__(self) -> AsyncUngatedRun:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


class _Taking:
    """`client.lease(...)` and `client.leadership(...)`: awaitable (the lease, or `LeaseBusy`
    raised) and an async context manager (the lease held for the block)."""

    def __init__(self, take: Callable[[], Awaitable[AsyncLease | LeaseBusy]]) -> None:
        self._take = take
        self._lease: AsyncLease | None = None

    async def _get(self) -> AsyncLease:
        taken = await self._take()
        if isinstance(taken, LeaseBusy):
            raise taken
        return taken

    def __await__(self) -> Generator[Any, None, AsyncLease]:
        return self._get().__await__()

    async def __aenter__(self) -> AsyncLease:
        self._lease = await self._get()
        return await self._lease.__aenter__()

    async def __aexit__(self, *exc_info: Any) -> None:
        if self._lease is not None:
            await self._lease.__aexit__(*exc_info)


class AsyncClient:
    """The asyncio version of `Client`, with the same options and methods (awaited)."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        auth_token: str | None = None,
        timeout: float = 10.0,
        on_sidecar_down: SidecarDownPolicy = "fail-closed",
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = protocol.base_url(base_url)
        self.timeout = timeout
        self.on_sidecar_down: SidecarDownPolicy = on_sidecar_down
        headers = {"authorization": f"Bearer {auth_token}"} if auth_token else {}
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=headers, timeout=timeout, transport=transport
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _send(self, call: protocol.Call, limit: float | None = None) -> dict[str, Any]:
        """One request; `limit` caps its timeout (seconds)."""
        timeout = protocol.timeout(call, self.timeout, limit)
        try:
            response = await self._http.request(
                call.method, call.path, json=call.body, timeout=timeout
            )
        except httpx.HTTPError as e:
            raise protocol.unreachable(self.base_url, timeout, e) from None
        return protocol.answer(response.status_code, response.text)

    async def health(self) -> Health:
        return cast(Health, await self._send(protocol.get("/healthz")))

    async def _take(
        self, kind: Literal["leases", "groups"], name: str, options: TakeOptions
    ) -> AsyncLease | LeaseBusy:
        sent_at = time.monotonic()
        body = await self._send(_held.take_call(kind, name, options))
        grant = protocol.granted(name, body)
        return protocol.busy(name, body) if grant is None else AsyncLease(self, grant, sent_at)

    async def _take_or_none(
        self, kind: Literal["leases", "groups"], name: str, options: TakeOptions
    ) -> AsyncLease | None:
        taken = await self._take(kind, name, options)
        return None if isinstance(taken, LeaseBusy) else taken

    async def acquire(self, name: str, **options: Unpack[TakeOptions]) -> AsyncLease | None:
        """See `Client.acquire`."""
        return await self._take_or_none("leases", name, options)

    def lease(self, name: str, **options: Unpack[TakeOptions]) -> _Taking:
        """`async with client.lease(name, ttl=...) as lease:`; raises `LeaseBusy` when busy."""
        return _Taking(lambda: self._take("leases", name, options))

    async def campaign(self, group: str, **options: Unpack[TakeOptions]) -> AsyncLease | None:
        """See `Client.campaign`."""
        return await self._take_or_none("groups", group, options)

    def leadership(self, group: str, **options: Unpack[TakeOptions]) -> _Taking:
        """`async with client.leadership(group, ttl=...) as term:`; raises `LeaseBusy` when
        another leads."""
        return _Taking(lambda: self._take("groups", group, options))

    async def leader(self, group: str) -> GroupState:
        path = f"/v1/groups/{protocol.segment(group)}"
        return cast(GroupState, await self._send(protocol.get(path)))

    async def observe(
        self, group: str, token: int | str | None = None, wait: Seconds = 30
    ) -> GroupState:
        """See `Client.observe`."""
        return cast(GroupState, await self._send(protocol.observe(group, token, wait)))

    async def tick(
        self, task: str, **options: Unpack[TickOptions]
    ) -> AsyncRun | AsyncUngatedRun | Skipped:
        """See `Client.tick`."""
        sent_at = time.monotonic()
        answer = protocol.ticked(task, await self._send(_held.tick_call(task, options)))
        if (wait := _held.early_wait(answer)) is not None:
            # Ticked a little before the slot by the store's clock: wait for it, tick again.
            await asyncio.sleep(wait)
            sent_at = time.monotonic()
            answer = protocol.ticked(task, await self._send(_held.tick_call(task, options)))
        if answer.grant is not None and answer.slot is not None:
            return AsyncRun(self, task, answer.slot, answer, answer.grant, sent_at)
        if answer.ungated:
            return AsyncUngatedRun(task, answer.slot)
        return Skipped(task, answer.slot, answer.reason or "not-due")

    async def gate(
        self,
        task: str,
        job: Callable[[AsyncRun | AsyncUngatedRun], Awaitable[object]],
        **options: Unpack[TickOptions],
    ) -> GateResult:
        """See `Client.gate`; a lost run cancels `job`."""
        try:
            run = await self.tick(task, **options)
            for _ in range(protocol.BUSY_RETRIES):
                if not (isinstance(run, Skipped) and run.reason == "busy"):
                    break
                await asyncio.sleep(protocol.BUSY_RETRY_SECONDS)
                run = await self.tick(task, **options)
        except (StoreDown, SidecarDown) as e:
            if (result := _held.unreached(e, self.on_sidecar_down)) is not None:
                return result
            run = AsyncUngatedRun(task, protocol.local_slot(options.get("every")))
        if isinstance(run, Skipped):
            return run.reason
        try:
            async with run:
                await job(run)
        except Exception as e:
            log.warning("%s: the run of slot %s failed: %s", task, run.slot, e)
            return "failed"
        return "ran"

    async def tasks(self) -> TaskList:
        return cast(TaskList, await self._send(protocol.get("/v1/tasks")))

    async def task(self, name: str, *, limit: int | None = None) -> TaskDetail:
        query = "" if limit is None else f"?limit={limit}"
        return cast(TaskDetail, await self._send(protocol.get(protocol.task_path(name) + query)))

    async def leases(self) -> LeaseList:
        return cast(LeaseList, await self._send(protocol.get("/v1/leases")))

    async def lease_state(self, name: str) -> LeaseState:
        path = f"/v1/leases/{protocol.segment(name)}"
        return cast(LeaseState, await self._send(protocol.get(path)))

    async def pause(
        self, name: str, *, reason: str | None = None, by: str | None = None
    ) -> TaskSummary:
        call = protocol.Call(
            "POST", protocol.task_path(name, "/pause"), {"reason": reason, "by": by}
        )
        return cast(TaskSummary, await self._send(call))

    async def resume(self, name: str) -> TaskSummary:
        call = protocol.Call("POST", protocol.task_path(name, "/resume"), {})
        return cast(TaskSummary, await self._send(call))

    async def trigger(self, name: str, *, by: str | None = None) -> TriggerRequest:
        call = protocol.Call("POST", protocol.task_path(name, "/trigger"), {"by": by})
        return cast(TriggerRequest, await self._send(call))
