"""The sync and asyncio clients against real sidecars sharing a SQLite file."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from leasehold_client import (
    AsyncClient,
    AsyncRun,
    AsyncUngatedRun,
    BadRequest,
    Client,
    Lease,
    LeaseBusy,
    LeaseLost,
    NoInstance,
    Run,
    SidecarDown,
    Skipped,
    Unauthorized,
    UngatedRun,
    UnknownTask,
)

from .support import Sidecar, free_port, settled_history

Start = Callable[..., Sidecar]


def release_elsewhere(url: str, name: str, token: int) -> None:
    """Frees the lease the way another party holding its token would."""
    answer = httpx.post(f"{url}/v1/leases/{name}/release", json={"token": str(token)})
    assert answer.json() == {"released": True}


def test_acquire_busy_release_hands_over(store: str, sidecars: Start) -> None:
    a, b = sidecars(store), sidecars(store)
    with Client(a.url) as ca, Client(b.url) as cb:
        lease = ca.acquire("report", ttl=3)
        assert lease is not None
        assert isinstance(lease.token, int)
        assert 0 < lease.valid_for <= 3
        assert cb.acquire("report", ttl=3) is None
        with pytest.raises(LeaseBusy) as busy:
            cb.lease("report", ttl=3)
        assert busy.value.code == "busy"
        assert busy.value.holder == lease.holder
        # A waiter through the other sidecar gets it as soon as it is released.
        got: list[Lease | None] = []
        waiter = threading.Thread(target=lambda: got.append(cb.acquire("report", ttl=3, wait=10)))
        waiter.start()
        time.sleep(0.3)
        started = time.monotonic()
        assert lease.release() is True
        waiter.join()
        assert time.monotonic() - started < 2
        following = got[0]
        assert following is not None
        assert following.token > lease.token
        # The released lease is not held any more, and says so.
        with pytest.raises(LeaseLost) as lost:
            lease.check()
        assert lost.value.reason == "released"
        assert lease.release() is False
        following.release()


def test_lease_kept_past_its_ttl_then_lost_with_its_sidecar(store: str, sidecars: Start) -> None:
    a, b = sidecars(store), sidecars(store)
    with Client(a.url) as ca, Client(b.url) as cb:
        with ca.lease("kept", ttl=1) as lease:
            time.sleep(3)
            lease.check()
            assert not lease.lost.is_set(), "kept alive by the watch thread"
            assert cb.acquire("kept", ttl=1) is None
        # A sidecar that goes away abruptly: no renewal, no watch answers. The block's end
        # raises, and the lease was marked lost within the validity it was granted.
        c = sidecars(store)
        cc = Client(c.url)
        with pytest.raises(LeaseLost) as lost, cc.lease("orphan", ttl=1) as orphan:  # noqa: PT012
            killed = time.monotonic()
            c.stop(9)
            assert orphan.lost.wait(2)
            assert time.monotonic() - killed <= 1.0
            assert orphan.valid_for == 0
        cc.close()
        assert lost.value.reason == "expired"
        # Another instance gets it once the store's ttl ran out.
        deadline = time.monotonic() + 4
        other = None
        while other is None and time.monotonic() < deadline:
            other = cb.acquire("orphan", ttl=1)
            time.sleep(0.1)
        assert other is not None, "taken over after the ttl"
        other.release()


def test_a_loss_raises_at_the_next_check(store: str, sidecars: Start) -> None:
    a = sidecars(store)
    client = Client(a.url)
    with pytest.raises(LeaseLost) as at_end, client.lease("checked", ttl=5) as lease:  # noqa: PT012
        lease.check()
        assert 2 < lease.keepalive() <= 5
        release_elsewhere(a.url, "checked", lease.token)
        assert lease.lost.wait(2), "the watch thread heard of it"
        assert lease.lost_reason == "released"
        with pytest.raises(LeaseLost) as at_check:
            lease.check()
        assert at_check.value.reason == "released"
        assert at_check.value.code == "lost"
        with pytest.raises(LeaseLost) as at_keepalive:
            lease.keepalive()
        assert at_keepalive.value.status == 410
    assert at_end.value.reason == "released"


def test_asyncio_a_loss_cancels_the_guarded_block(store: str, sidecars: Start) -> None:
    a = sidecars(store)

    async def main() -> None:
        async with AsyncClient(a.url) as client:
            reached_end = False
            started = time.monotonic()
            with pytest.raises(LeaseLost) as lost:  # noqa: PT012
                async with client.lease("guarded", ttl=5) as lease:
                    await asyncio.to_thread(release_elsewhere, a.url, "guarded", lease.token)
                    await asyncio.sleep(10)
                    reached_end = True
            assert not reached_end
            assert time.monotonic() - started < 2, "cancelled at the loss, not after the sleep"
            assert lost.value.reason == "released"
            assert lease.lost.is_set()
            # The task itself was not left cancelled: it goes on awaiting.
            task = asyncio.current_task()
            assert task is not None
            assert task.cancelling() == 0
            await asyncio.sleep(0.01)
            # A cancellation from outside is not turned into a loss.
            inner = asyncio.create_task(hold(client))
            await asyncio.sleep(0.5)
            inner.cancel()
            with pytest.raises(asyncio.CancelledError):
                await inner

    async def hold(client: AsyncClient) -> None:
        async with client.lease("held-outside", ttl=5):
            await asyncio.sleep(10)

    asyncio.run(main())


def test_one_run_per_slot_across_two_sidecars(store: str, sidecars: Start) -> None:
    a, b = sidecars(store), sidecars(store)
    runs: list[tuple[int, int | None, str]] = []
    with Client(a.url) as ca, Client(b.url) as cb:

        def job(name: str) -> Callable[[Run | UngatedRun], None]:
            def work(run: Run | UngatedRun) -> None:
                assert run.slot is not None
                runs.append((run.slot, run.token, name))
                time.sleep(0.03)

            return work

        end = time.monotonic() + 3.5
        while time.monotonic() < end:
            # Both instances' timers fire together, as replicas' timers do.
            results: list[str] = []
            threads = [
                threading.Thread(
                    target=lambda c=c, n=n, r=results: r.append(c.gate("sweep", job(n), every=0.5))
                )
                for c, n in ((ca, "a"), (cb, "b"))
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert set(results) <= {"ran", "already-run", "busy"}, results
            time.sleep(0.07)
        slots = [slot for slot, _, _ in runs]
        assert len(set(slots)) == len(slots), f"a slot ran twice: {runs}"
        assert len(slots) >= 5
        tokens = [token or 0 for _, token, _ in runs]
        assert tokens == sorted(tokens), "tokens go up with the slots"
        ok = {r["slot"] for r in settled_history(store, "sweep") if r["outcome"] == "ok"}
        assert set(slots) <= ok

        # A failing job is recorded failed, with its error.
        def fail(run: Run | UngatedRun) -> None:
            raise RuntimeError("disk full")

        assert ca.gate("fails", fail, every=60) == "failed"
        [entry] = settled_history(store, "fails")
        assert entry["outcome"] == "failed"
        assert entry["error"] == "RuntimeError: disk full"


def test_tick_returns_runs_and_skips(store: str, sidecars: Start) -> None:
    a = sidecars(store)
    with Client(a.url) as client:
        # A daily slot hours ago is a first tick's only with a catch-up window that reaches it.
        day = timedelta(days=1)
        run = client.tick("nightly", cron="0 3 * * *", tz="Europe/Berlin", catch_up_window=day)
        assert isinstance(run, Run)
        assert run.trigger in ("timer", "catch-up")
        assert run.gated
        with run:
            run.check()
        again = client.tick("nightly", cron="0 3 * * *", tz="Europe/Berlin", catch_up_window=day)
        assert isinstance(again, Skipped)
        assert not again
        assert again.reason == "already-run"
        assert again.slot == run.slot
        [entry] = settled_history(store, "nightly")
        assert entry["schedule"] == {"cron": "CRON_TZ=Europe/Berlin 0 3 * * *"}
        # The catalog lists this process (not its sidecar) as the task's instance.
        instances = [i["instance"] for i in client.task("nightly")["instances"]]
        assert instances == [f"{socket.gethostname()}-{os.getpid()}"]


def test_a_failed_run_is_retried_by_a_later_tick(store: str, sidecars: Start) -> None:
    a = sidecars(store)
    with Client(a.url) as client:

        def tick() -> Run | UngatedRun | Skipped:
            return client.tick("retried", every=600, retries=1, retry_backoff=0.2)

        first = tick()
        assert isinstance(first, Run)
        assert (first.trigger, first.attempt) == ("timer", 1)
        first.done("failed", "boom")
        retry = tick()
        for _ in range(20):
            if isinstance(retry, Run):
                break
            assert isinstance(retry, Skipped)
            assert retry.reason == "not-due"
            time.sleep(0.1)
            retry = tick()
        assert isinstance(retry, Run)
        assert (retry.trigger, retry.attempt, retry.slot) == ("retry", 2, first.slot)
        retry.done("ok")
        with pytest.raises(BadRequest) as bad:
            client.tick("retried", every=600, overlap=cast(Any, "replace"))
        assert bad.value.field == "overlap"


def test_asyncio_gate_runs_once_per_slot(store: str, sidecars: Start) -> None:
    a, b = sidecars(store), sidecars(store)

    async def main() -> list[str]:
        async with AsyncClient(a.url) as ca, AsyncClient(b.url) as cb:
            ran: list[int | None] = []

            async def job(run: AsyncRun | AsyncUngatedRun) -> None:
                ran.append(run.slot)
                await asyncio.sleep(0.05)

            # Hourly slots: the one now is on time for a first tick, whenever the test runs.
            schedule = {"every": timedelta(hours=1)}
            results = await asyncio.gather(
                ca.gate("async-nightly", job, **schedule),  # type: ignore[arg-type]
                cb.gate("async-nightly", job, **schedule),  # type: ignore[arg-type]
            )
            assert len(ran) == 1
            return sorted(results)

    assert asyncio.run(main()) == ["already-run", "ran"]


def test_fleet_control_pause_resume_trigger(store: str, sidecars: Start) -> None:
    a = sidecars(store)
    with Client(a.url) as client:
        assert client.gate("report", lambda run: None, every=3600) == "ran"
        [summary] = [t for t in client.tasks()["tasks"] if t["name"] == "report"]
        assert summary["definition"] is not None
        assert summary["definition"]["source"] == "sidecar"
        paused = client.pause("report", reason="migrating", by="ops")
        assert paused["state"] == "paused"
        skipped = client.tick("report", every=3600)
        assert isinstance(skipped, Skipped)
        assert skipped.reason == "paused"
        assert client.resume("report")["paused"] is None
        request = client.trigger("report", by="ops")
        manual = client.tick("report", every=3600)
        assert isinstance(manual, Run)
        assert manual.trigger == "manual"
        manual.done()
        detail = client.task("report", limit=5)
        assert detail["history"][0]["request"] == {"id": request["id"], "by": "ops"}
        # Bad input is a BadRequest naming the field; unknown tasks are UnknownTask.
        with pytest.raises(BadRequest) as bad:
            client.acquire("x", ttl=0.5)
        assert bad.value.field == "ttl_ms"
        assert bad.value.status == 400
        with pytest.raises(UnknownTask):
            client.task("no-such-task")
    # A task whose only instance went away (its heartbeat lapsed): nobody would take a trigger.
    c = sidecars(store)
    with Client(c.url) as client:
        assert client.gate("gone", lambda run: None, every=3600, ttl=1) == "ran"
        c.stop(9)
    with Client(a.url) as client:
        time.sleep(1.5)
        with pytest.raises(NoInstance):
            client.trigger("gone")


def test_done_keeps_the_runs_output_its_end_when_long(store: str, sidecars: Start) -> None:
    a = sidecars(store)
    printed = "step 1\n\x1b[31mred\x1b[0m\n"
    long = "€" * 30_000 + "THE END"
    with Client(a.url) as client:
        for task, output in [("py-output", printed), ("py-output-long", long)]:
            run = client.tick(task, every=3600)
            assert isinstance(run, Run)
            run.done("failed", "boom", output=output)
            kept = None
            for _ in range(50):
                kept = client.task(task, limit=1)["history"][0]
                if kept["output"] is not None:
                    break
                time.sleep(0.1)
            assert kept is not None
            assert kept["outcome"] == "failed", kept
            shown = kept["output"]
            assert shown is not None
            if output == printed:
                assert shown == printed
            else:
                assert output.endswith(shown)
                assert shown.endswith("€THE END")
                assert 65536 - 3 < len(shown.encode()) <= 65536


def test_leadership(store: str, sidecars: Start) -> None:
    a, b = sidecars(store), sidecars(store)
    with Client(a.url) as ca, Client(b.url) as cb:
        term = ca.campaign("workers", ttl=5)
        assert term is not None
        state = cb.leader("workers")
        assert state["leader"] == term.holder
        assert state["token"] == str(term.token)
        with pytest.raises(LeaseBusy):
            cb.leadership("workers", ttl=5)
        threading.Timer(0.3, term.release).start()
        started = time.monotonic()
        changed = cb.observe("workers", term.token, wait=10)
        assert changed["leader"] is None
        assert time.monotonic() - started < 2
        with cb.leadership("workers", ttl=5) as next_term:
            assert next_term.token > term.token


def test_sidecar_down_policies(tmp_path: Path) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    ran: list[Run | UngatedRun] = []
    with Client(nowhere, timeout=1) as closed:
        with pytest.raises(SidecarDown) as down:
            closed.acquire("x", ttl=5)
        assert down.value.code == "sidecar-down"
        assert down.value.status == 0
        assert closed.gate("sweep", ran.append, every=30) == "sidecar-down"
        assert ran == []
    with Client(nowhere, timeout=1, on_sidecar_down="fail-open") as open_:
        assert open_.gate("sweep", ran.append, every=30) == "ran"
    [run] = ran
    assert isinstance(run, UngatedRun)
    assert run.token is None
    assert not run.gated
    assert run.slot is not None
    assert run.slot % 30_000 == 0
    assert abs(run.slot - time.time() * 1000) <= 30_000


def test_auth_token(store: str, sidecars: Start, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token-of-the-test\n")
    a = sidecars(store, "--auth-token-file", str(token_file))
    with Client(a.url) as anonymous, pytest.raises(Unauthorized):
        anonymous.tasks()
    with Client(a.url, auth_token="s3cret-token-of-the-test") as client:
        assert client.tasks()["tasks"] == []
