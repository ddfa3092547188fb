"""The HTTP API's requests and answers, shared by the sync and the asyncio client: what to send
for each operation and what an answer means. No I/O here."""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal
from urllib.parse import quote

import httpx

from ._errors import BadAnswer, LeaseBusy, SidecarDown, error_for

#: A duration: seconds (int or float), or a timedelta.
Seconds = float | timedelta

Outcome = Literal["ok", "failed"]
StoreDownPolicy = Literal["fail-closed", "fail-open", "local"]
#: What started a gated run (`retry`: a slot run again, after a failure or a cut-off run).
Trigger = Literal["timer", "catch-up", "manual", "retry"]
SidecarDownPolicy = Literal["fail-closed", "fail-open"]
#: Why a tick did not run: the API's reasons, and `sidecar-down` (from `gate` only).
SkipReason = Literal[
    "not-leader", "already-run", "busy", "store-down", "not-due", "paused", "sidecar-down"
]

DEFAULT_SIDECAR = "http://127.0.0.1:7070"
#: A failed run's error is kept up to this many characters (the sidecar cuts at 2,000 bytes).
ERROR_TEXT_LIMIT = 2000
#: A run's output is kept up to its last this many bytes of UTF-8 (the sidecar's limit).
OUTPUT_BYTES_LIMIT = 65536
#: How often, and how far apart, `gate` asks again when the task is busy: a slot whose task
#: is still held by a finishing run (a replica shutting down) is then not missed.
BUSY_RETRIES = 4
BUSY_RETRY_SECONDS = 0.1


def base_url(given: str | None) -> str:
    return (given or os.environ.get("LEASEHOLD_SIDECAR") or DEFAULT_SIDECAR).rstrip("/")


def millis(value: Seconds) -> int:
    """`value` in whole milliseconds."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    return round(seconds * 1000)


def segment(name: str) -> str:
    """A lease, group or task name as one path segment. HTTP clients resolve `.` and `..`
    segments away, `%2E` included, so their dots go as `%252E`: names never hold `%`, and the
    sidecar reads a `%2E` left after decoding a path as a dot."""
    if name in (".", ".."):
        return name.replace(".", "%252E")
    return quote(name, safe="")


@dataclass(frozen=True)
class Call:
    """One request: `wait` is how long (seconds) the sidecar may hold it before answering."""

    method: str
    path: str
    body: dict[str, Any] | None = None
    wait: float = 0.0


def timeout(call: Call, client_timeout: float, limit: float | None) -> float:
    """A request's timeout (seconds): the client's on top of the wait asked for, capped by
    `limit`."""
    seconds = client_timeout + call.wait
    return seconds if limit is None else min(seconds, limit)


def unreachable(base_url: str, timeout: float, error: httpx.HTTPError) -> SidecarDown:
    """What a request that got no answer (`error`, within `timeout` seconds) raises."""
    if isinstance(error, httpx.TimeoutException):
        why = f"no answer within {timeout:.3g} s"
    else:
        why = str(error)
    return SidecarDown(f"sidecar {base_url} unreachable: {why}", code="sidecar-down")


def instance() -> str:
    """This application replica's id, sent with every tick and lease request so the catalog
    (`leasehold status`, the page) lists replicas, not sidecars: `LEASEHOLD_INSTANCE`, else
    host name and pid (read at each call: a forked worker is a replica of its own)."""
    return os.environ.get("LEASEHOLD_INSTANCE") or f"{socket.gethostname()}-{os.getpid()}"


def take(
    kind: Literal["leases", "groups"],
    name: str,
    ttl: Seconds,
    wait: Seconds,
    keepalive: Seconds | None,
    holder: str | None,
) -> Call:
    """Acquire a lease, or campaign for a group's leadership."""
    body: dict[str, Any] = {
        "ttl_ms": millis(ttl),
        "wait_ms": millis(wait),
        "instance": instance(),
    }
    if keepalive is not None:
        body["keepalive_ms"] = millis(keepalive)
    if holder is not None:
        body["holder"] = holder
    action = "acquire" if kind == "leases" else "campaign"
    return Call("POST", f"/v1/{kind}/{segment(name)}/{action}", body, millis(wait) / 1000)


def watch(name: str, token: int, wait: float) -> Call:
    wait_ms = millis(wait)
    return Call(
        "POST", f"/v1/leases/{segment(name)}/watch", {"token": str(token), "wait_ms": wait_ms}, wait
    )


def keepalive(name: str, token: int) -> Call:
    return Call("POST", f"/v1/leases/{segment(name)}/keepalive", {"token": str(token)})


def release(name: str, token: int) -> Call:
    return Call("POST", f"/v1/leases/{segment(name)}/release", {"token": str(token)})


def output_tail(output: str) -> str:
    """The end of `output` the sidecar keeps: its last `OUTPUT_BYTES_LIMIT` bytes of UTF-8,
    from a character boundary (so the body stays within the sidecar's size limit). A lone
    surrogate, which the sidecar's JSON parser refuses, becomes `?`."""
    raw = output.encode("utf-8", "replace")
    return raw[-OUTPUT_BYTES_LIMIT:].decode("utf-8", "ignore")


def done(
    task: str,
    slot: int,
    token: int,
    outcome: Outcome,
    error: str | None,
    output: str | None = None,
) -> Call:
    body: dict[str, Any] = {"token": str(token), "outcome": outcome}
    if error is not None:
        body["error"] = error[:ERROR_TEXT_LIMIT]
    if output is not None:
        body["output"] = output_tail(output)
    return Call("POST", f"/v1/tasks/{segment(task)}/ticks/{slot}/done", body)


def tick(
    task: str,
    every: Seconds | None,
    cron: str | None,
    tz: str | None,
    group: str | None,
    ttl: Seconds | None,
    keepalive: Seconds | None,
    on_store_down: StoreDownPolicy | None,
    catch_up_window: Seconds | None = None,
    policies: RunPolicies | None = None,
) -> Call:
    """The gated tick. Exactly one of `every` and `cron` (the sidecar says which field is
    wrong otherwise); `tz` only with `cron`."""
    body: dict[str, Any] = {"instance": instance()}
    if every is not None:
        body["every_ms"] = millis(every)
    if cron is not None:
        body["cron"] = cron
    if tz is not None:
        body["time_zone"] = tz
    if group is not None:
        body["group"] = group
    if ttl is not None:
        body["ttl_ms"] = millis(ttl)
    if keepalive is not None:
        body["keepalive_ms"] = millis(keepalive)
    if on_store_down is not None:
        body["on_store_down"] = on_store_down
    if catch_up_window is not None:
        body["catch_up_window_ms"] = millis(catch_up_window)
    if policies is not None:
        body.update(policies.fields())
    return Call("POST", f"/v1/tasks/{segment(task)}/ticks", body)


@dataclass(frozen=True)
class RunPolicies:
    """A tick's run policies (`TickOptions`), each left to the sidecar's default when None; the
    sidecar checks each value and names the field of a bad one."""

    timeout: Seconds | None = None
    retries: int | None = None
    retry_backoff: Seconds | None = None
    retry_backoff_max: Seconds | None = None
    overlap: str | None = None
    jitter: Seconds | None = None
    on_interrupt: str | None = None
    history: int | None = None

    def fields(self) -> dict[str, Any]:
        durations = {
            "timeout_ms": self.timeout,
            "retry_backoff_ms": self.retry_backoff,
            "retry_backoff_max_ms": self.retry_backoff_max,
            "jitter_ms": self.jitter,
        }
        body: dict[str, Any] = {k: millis(v) for k, v in durations.items() if v is not None}
        words = {
            "retries": self.retries,
            "overlap": self.overlap,
            "on_interrupt": self.on_interrupt,
            "history": self.history,
        }
        body.update({k: v for k, v in words.items() if v is not None})
        return body


def get(path: str) -> Call:
    return Call("GET", path)


def task_path(name: str, action: str = "") -> str:
    return f"/v1/tasks/{segment(name)}{action}"


def observe(group: str, token: int | str | None, wait: Seconds) -> Call:
    wait_ms = millis(wait)
    body = {"token": None if token is None else str(token), "wait_ms": wait_ms}
    return Call("POST", f"/v1/groups/{segment(group)}/observe", body, wait_ms / 1000)


def one_line(text: str) -> str:
    """Who asked or why, as the API takes it: one line."""
    return " ".join(text.split())


def answer(status: int, text: str) -> dict[str, Any]:
    """The JSON of an answer, or the exception its error answer means."""
    try:
        parsed = json.loads(text)
    except ValueError:
        raise BadAnswer(
            f"the sidecar answered {status} without JSON", code="bad-answer", status=status
        ) from None
    if not isinstance(parsed, dict):
        raise BadAnswer(
            f"the sidecar answered {status} with JSON that is not an object",
            code="bad-answer",
            status=status,
        )
    if status >= 400:
        raise error_for(
            str(parsed.get("error", "error")),
            str(parsed.get("message", f"the sidecar answered {status}")),
            status,
            _text_or_none(parsed.get("field")),
            _text_or_none(parsed.get("reason")),
        )
    return parsed


def _text_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class Grant:
    """A lease or run granted: `valid_for` and `keepalive` in seconds."""

    name: str
    token: int
    holder: str
    valid_for: float
    keepalive: float


def granted(name: str, body: dict[str, Any]) -> Grant | None:
    """The grant in an acquire or campaign answer; None when busy."""
    if body.get("acquired") is not True:
        return None
    return _grant(name, body, str(body.get("holder", "")))


def busy(name: str, body: dict[str, Any]) -> LeaseBusy:
    return LeaseBusy(
        name, _text_or_none(body.get("holder")), int(body.get("remaining_ms", 0)) / 1000
    )


def _grant(name: str, body: dict[str, Any], holder: str) -> Grant:
    try:
        return Grant(
            name=name,
            token=int(body["token"]),
            holder=holder,
            valid_for=int(body["valid_for_ms"]) / 1000,
            keepalive=int(body["keepalive_ms"]) / 1000,
        )
    except (KeyError, TypeError, ValueError) as e:
        raise BadAnswer(f"a grant without {e}", code="bad-answer", status=200) from None


@dataclass(frozen=True)
class TickAnswer:
    """What a tick answered: a gated run (`grant`), an ungated one, or why not."""

    slot: int | None
    grant: Grant | None
    ungated: bool
    manual: bool
    reason: SkipReason | None
    #: For a tick a little before its slot (the caller's clock ahead of the store's): seconds
    #: until the slot starts; ticking again then runs it.
    starts_in: float | None = None
    #: For a gated run: what started it, and which attempt of the slot it is.
    trigger: Trigger = "timer"
    attempt: int = 1


def ticked(task: str, body: dict[str, Any]) -> TickAnswer:
    slot = body.get("slot")
    slot = None if slot is None else int(slot)
    if body.get("run") is not True:
        starts_in = body.get("starts_in_ms")
        return TickAnswer(
            slot,
            None,
            False,
            False,
            body.get("reason", "not-due"),
            None if starts_in is None else int(starts_in) / 1000,
        )
    if body.get("gated") is False:
        return TickAnswer(slot, None, True, False, None)
    trigger = body.get("trigger")
    # A run beside another (overlap allow) keeps a run lease of its own, named in `lease`.
    lease = body.get("lease")
    return TickAnswer(
        slot,
        _grant(lease if isinstance(lease, str) else task, body, ""),
        False,
        trigger == "manual",
        None,
        trigger=trigger if trigger in ("catch-up", "manual", "retry") else "timer",
        attempt=int(body.get("attempt", 1)),
    )


def local_slot(every: Seconds | None) -> int | None:
    """The slot of an `every` schedule on this host's clock (for fail-open without a sidecar);
    None for cron schedules, which this client does not evaluate."""
    if every is None:
        return None
    every_ms = millis(every)
    now_ms = time.time_ns() // 1_000_000
    return now_ms // every_ms * every_ms if every_ms > 0 else None


def failure_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"
