// The client against real sidecars: a SQLite file shared by two sidecars, and one Redis test.
import { after, before, describe, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";

import { LeaseholdClient, LeaseholdError } from "../dist/index.js";
import { BIN, redis, sidecar, sleep, tempDir } from "../support/helpers.mjs";

/** Resolves when `signal` has aborted (at once if it already has). */
const aborted = (signal) =>
  signal.aborted ? Promise.resolve() : new Promise((ok) => signal.addEventListener("abort", ok, { once: true }));

const dir = tempDir();
const store = `sqlite:${join(dir, "leases.db")}`;
let a, b, ca, cb;

before(async () => {
  [a, b] = await Promise.all([sidecar(store), sidecar(store)]);
  ca = new LeaseholdClient({ baseUrl: a.url });
  cb = new LeaseholdClient({ baseUrl: b.url });
});

after(async () => {
  await Promise.all([a.stop(), b.stop()]);
});

test("acquire, busy elsewhere, release hands over, tokens are exact decimal strings", async () => {
  const lease = await ca.acquire("report", { ttlMs: 3000 });
  assert.ok(lease);
  assert.match(lease.token, /^[0-9]{1,20}$/);
  assert.ok(lease.validForMs > 0 && lease.validForMs <= 3000);
  assert.equal(await cb.acquire("report", { ttlMs: 3000 }), null, "busy for the other sidecar");
  // A waiter on the other sidecar gets it as soon as it is released.
  const waiting = cb.acquire("report", { ttlMs: 3000, waitMs: 10000 });
  await sleep(300);
  const started = performance.now();
  assert.equal(await lease.release(), true);
  const next = await waiting;
  assert.ok(next, "handed over");
  assert.ok(performance.now() - started < 2000);
  assert.ok(BigInt(next.token) > BigInt(lease.token));
  assert.ok(lease.signal.aborted, "the released lease's signal aborted");
  await next.release();
});

test("the lease is kept past its ttl while held, and its signal aborts when it is lost", async () => {
  const lease = await ca.acquire("kept", { ttlMs: 1000, keepaliveMs: 1000 });
  await sleep(3000);
  assert.equal(lease.signal.aborted, false, "kept alive by the watch loop");
  assert.equal(await cb.acquire("kept", { ttlMs: 1000 }), null);
  // The sidecar that holds it goes away abruptly: no renewal, no watch answers.
  const c = await sidecar(store);
  const cc = new LeaseholdClient({ baseUrl: c.url });
  const orphan = await cc.acquire("orphan", { ttlMs: 1000 });
  const lostAt = performance.now();
  await c.stop("SIGKILL");
  await aborted(orphan.signal);
  assert.ok(performance.now() - lostAt <= 1000, "aborted within the validity it was granted");
  // Another instance gets it once the store's ttl ran out.
  let other = null;
  for (let i = 0; i < 40 && !other; i++) {
    other = await cb.acquire("orphan", { ttlMs: 1000 });
    if (!other) await sleep(100);
  }
  assert.ok(other, "taken over after the ttl");
  await Promise.all([lease.release(), other.release()]);
});

test("an application that stops calling loses its lease within keepalive", async () => {
  // Raw calls, no keepalive loop: the application is frozen after acquiring.
  const granted = await ca.post("/v1/leases/frozen/acquire", { ttl_ms: 5000, keepalive_ms: 500 });
  assert.equal(granted.acquired, true);
  await sleep(800);
  const other = await cb.acquire("frozen", { ttlMs: 5000 });
  assert.ok(other, "the frozen app's lease was given up, not held for the 5 s ttl");
  await assert.rejects(ca.post("/v1/leases/frozen/keepalive", { token: granted.token }), (e) => {
    assert.ok(e instanceof LeaseholdError);
    assert.equal(e.status, 410);
    assert.equal(e.reason, "app-silent");
    return true;
  });
  await other.release();
});

test("one run per slot across two sidecars ticking at the same moment, and done feeds the history", async () => {
  const runs = [];
  const end = Date.now() + 3500;
  while (Date.now() < end) {
    // Both instances' timers fire together, as replicas' timers do.
    const results = await Promise.all(
      [["a", ca], ["b", cb]].map(([name, c]) =>
        c.gate("ts-sweep", { everyMs: 500 }, async (run) => {
          runs.push({ slot: run.slot, name, token: run.token });
          await sleep(30);
        }),
      ),
    );
    for (const result of results) assert.ok(["ran", "already-run", "busy"].includes(result), result);
    await sleep(70);
  }
  const slots = runs.map((r) => r.slot);
  assert.equal(new Set(slots).size, slots.length, `a slot ran twice: ${JSON.stringify(runs)}`);
  assert.ok(slots.length >= 5, `${slots.length} runs`);
  await sleep(300);
  const history = JSON.parse(
    execFileSync(BIN, ["history", "--store", store, "ts-sweep", "--json", "--limit", "100"]).toString(),
  ).runs;
  const ok = history.filter((r) => r.outcome === "ok").map((r) => r.slot);
  for (const slot of slots) assert.ok(ok.includes(slot), `slot ${slot} recorded ok`);
  assert.ok(new Set(runs.map((r) => r.name)).size >= 1);
  // The run tokens go up with the slots.
  for (let i = 1; i < runs.length; i++) assert.ok(BigInt(runs[i].token) > BigInt(runs[i - 1].token));
});

test("a cron schedule in a time zone: one run per slot, the history carries the zone", async () => {
  // A daily slot 9 to 13 hours ago in Berlin (a tick within an hour of its slot is on time),
  // never at 01:00-03:59, where a DST change can drop or double a slot.
  const berlinHour = Number(
    new Intl.DateTimeFormat("en-GB", { timeZone: "Europe/Berlin", hour: "2-digit", hourCycle: "h23" }).format(new Date()),
  );
  let hour = (berlinHour + 12) % 24;
  if (hour >= 1 && hour <= 3) hour += 3;
  const cron = `0 ${hour} * * *`;
  // The first tick of a daily task comes hours after its latest slot: that slot runs only
  // within the catch-up window (an hour by default), so a day's window here.
  const late = await ca.tick("ts-nightly", { cron, timeZone: "Europe/Berlin", catchUpWindowMs: 1 });
  assert.equal(late.run, false, JSON.stringify(late));
  assert.equal(late.reason, "not-due");
  assert.ok(late.startsInMs > 0 && late.startsInMs <= 86_400_000, JSON.stringify(late));
  const schedule = { cron, timeZone: "Europe/Berlin", catchUpWindowMs: 86_400_000 };
  let trigger;
  const results = await Promise.all(
    [ca, cb].map((c) => c.gate("ts-nightly", schedule, async (run) => { trigger = run.trigger; await sleep(30); })),
  );
  assert.equal(results.filter((r) => r === "ran").length, 1, JSON.stringify(results));
  // The other sidecar finds that late slot taken: already-run, busy, or not due for it.
  assert.ok(results.every((r) => ["ran", "already-run", "busy", "not-due"].includes(r)), JSON.stringify(results));
  assert.equal(trigger, "catch-up", "a slot run late says so");
  const [run] = JSON.parse(execFileSync(BIN, ["history", "--store", store, "ts-nightly", "--json"]).toString()).runs;
  assert.deepEqual(run.schedule, { cron: `CRON_TZ=Europe/Berlin ${cron}` });
  // The slot is the latest HOUR:00 in Berlin: `leasehold next` after the day before names it.
  const next = JSON.parse(
    execFileSync(BIN, ["next", "--cron", cron, "--tz", "Europe/Berlin", "--json", "-n", "2", "--after",
      new Date(run.slot - 86_400_000 - 1000).toISOString()]).toString(),
  );
  assert.ok(next.firings.some((f) => f.slot_ms === run.slot), JSON.stringify({ run, next }));
  const local = new RegExp(`T${String(hour).padStart(2, "0")}:00:00\\+0[12]:00$`);
  assert.match(next.firings.find((f) => f.slot_ms === run.slot).local, local);
});

test("a failed job is recorded failed with its error", async () => {
  const result = await ca.gate("ts-failing", { everyMs: 60_000 }, async () => {
    throw new Error("webhook endpoint answered 500");
  });
  assert.equal(result, "failed");
  // The outcome is written to the store in the background, after the answer to done.
  let history;
  for (let i = 0; i < 50 && history?.[0]?.outcome !== "failed"; i++) {
    if (i > 0) await sleep(100);
    history = JSON.parse(execFileSync(BIN, ["history", "--store", store, "ts-failing", "--json"]).toString()).runs;
  }
  assert.equal(history.length, 1, JSON.stringify(history));
  assert.equal(history[0].outcome, "failed");
  assert.match(JSON.stringify(history[0]), /webhook endpoint answered 500/);
  assert.equal(await cb.gate("ts-failing", { everyMs: 60_000 }, async () => {}), "already-run");
});

test("the signal aborts with the sidecar's reason when the lease ends elsewhere", async () => {
  const lease = await ca.acquire("ended-elsewhere", { ttlMs: 4000 });
  assert.ok(lease);
  // Another part of the application (or an operator) releases the same tenure by its token.
  const started = performance.now();
  assert.equal((await ca.post("/v1/leases/ended-elsewhere/release", { token: lease.token })).released, true);
  await aborted(lease.signal);
  assert.ok(performance.now() - started < 1500, "the watch in flight answered the loss");
  assert.equal(lease.signal.reason.reason, "released");
  assert.equal(lease.validForMs, 0);
  assert.equal(await lease.release(), false, "no longer ours");
});

test("a frozen process: validity is 0 the moment it wakes, and another instance has the lease", async () => {
  const lease = await ca.acquire("frozen-loop", { ttlMs: 10_000, keepaliveMs: 600 });
  assert.ok(lease);
  assert.ok(lease.validForMs > 0 && lease.validForMs <= 600, `${lease.validForMs}`);
  // The event loop blocks for 2 s (a long GC pause, a synchronous call gone wrong): no watch goes out.
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 2000);
  assert.equal(lease.validForMs, 0, "no validity left on waking, before any timer ran");
  await sleep(0);
  assert.ok(lease.signal.aborted, "aborted on the first turn of the event loop");
  // The sidecar gave the lease up for the silence (not after the 10 s ttl).
  const other = await cb.acquire("frozen-loop", { ttlMs: 10_000 });
  assert.ok(other, "another instance took it over");
  assert.ok(BigInt(other.token) > BigInt(lease.token));
  await other.release();
});

test("a stopped sidecar: the lease aborts when its validity runs out, gate fails closed in timeoutMs", async () => {
  const c = await sidecar(store);
  const cc = new LeaseholdClient({ baseUrl: c.url, timeoutMs: 800 });
  const lease = await cc.acquire("stopped-sidecar", { ttlMs: 2000, keepaliveMs: 1000 });
  assert.ok(lease);
  c.child.kill("SIGSTOP");
  try {
    const stoppedAt = performance.now();
    await aborted(lease.signal);
    const abortedAfter = performance.now() - stoppedAt;
    assert.ok(abortedAfter <= 1100, `aborted ${abortedAfter} ms after the sidecar stopped (keepalive 1000)`);
    assert.equal(lease.signal.reason.reason, "expired");
    let ran = false;
    const before = performance.now();
    assert.equal(await cc.gate("stopped-task", { everyMs: 1000 }, async () => { ran = true; }), "sidecar-down");
    const took = performance.now() - before;
    assert.ok(took >= 700 && took < 3000, `gate gave up after ${took} ms`);
    assert.equal(ran, false);
  } finally {
    c.child.kill("SIGCONT");
    await c.stop("SIGKILL");
  }
});

test("observe answers when the leadership changes", async () => {
  assert.deepEqual(await cb.observe("ts-group", null, 200), { group: "ts-group", leader: null, token: null, remaining_ms: 0 });
  const term = await ca.campaign("ts-group", { ttlMs: 3000, holder: "pod-a" });
  assert.ok(term);
  const now = await cb.observe("ts-group", null, 5000);
  assert.equal(now.token, term.token);
  assert.match(now.leader, /^pod-a/);
  // Someone watching the current term hears of its end at once, not after the wait.
  const watching = cb.observe("ts-group", term.token, 20_000);
  await sleep(300);
  const released = performance.now();
  await term.release();
  const after = await watching;
  assert.ok(performance.now() - released < 2000);
  assert.notEqual(after.token, term.token);
  const next = await cb.campaign("ts-group", { ttlMs: 3000 });
  assert.ok(next && BigInt(next.token) > BigInt(term.token));
  assert.equal((await ca.leader("ts-group")).token, next.token);
  await next.release();
});

test("with --auth-token-file: the client's bearer token is required", async () => {
  const tokenFile = join(dir, "auth-token");
  writeFileSync(tokenFile, "0123456789abcdef0123456789abcdef\n");
  const c = await sidecar(store, ["--auth-token-file", tokenFile]);
  try {
    const anonymous = new LeaseholdClient({ baseUrl: c.url });
    await assert.rejects(anonymous.acquire("authed", { ttlMs: 1000 }), (e) => e.status === 401 && e.error === "unauthorized");
    const wrong = new LeaseholdClient({ baseUrl: c.url, authToken: "0123456789abcdef0123456789abcdeX" });
    await assert.rejects(wrong.acquire("authed", { ttlMs: 1000 }), (e) => e.status === 401);
    const authed = new LeaseholdClient({ baseUrl: c.url, authToken: "0123456789abcdef0123456789abcdef" });
    const lease = await authed.acquire("authed", { ttlMs: 1000 });
    assert.ok(lease);
    await sleep(1500);
    assert.equal(lease.signal.aborted, false, "the watch loop carries the token too");
    assert.equal(await lease.release(), true);
  } finally {
    await c.stop();
  }
});

test("a failed run is retried by a later tick as attempt 2, trigger retry, the same slot", async () => {
  const options = { everyMs: 600_000, retries: 1, retryBackoffMs: 200 };
  const first = await ca.tick("ts-retried", options);
  assert.equal(first.run, true);
  assert.equal(first.attempt, 1);
  await first.done("failed", "boom");
  let retry = await cb.tick("ts-retried", options);
  assert.equal(retry.reason, "already-run", "a retry is kept by the sidecar that heard the failure");
  for (let i = 0; i < 20 && retry.run !== true; i++) {
    await sleep(100);
    retry = await ca.tick("ts-retried", options);
  }
  assert.equal(retry.run, true, JSON.stringify(retry));
  assert.deepEqual([retry.trigger, retry.attempt, retry.slot], ["retry", 2, first.slot]);
  await retry.done("ok");
  assert.equal((await ca.tick("ts-retried", options)).reason, "already-run");
});

test("bad input is a 400 naming the field", async () => {
  await assert.rejects(ca.tick("t", { everyMs: 1000, retries: 101 }), (e) => e.status === 400 && e.field === "retries");
  await assert.rejects(ca.tick("t", { everyMs: 1000, overlap: "replace" }), (e) => e.status === 400 && e.field === "overlap");
  await assert.rejects(ca.acquire("x", { ttlMs: 5 }), (e) => e.status === 400 && e.field === "ttl_ms");
  await assert.rejects(ca.tick("t", { cron: "not cron" }), (e) => e.status === 400 && e.field === "cron");
  await assert.rejects(
    ca.tick("t", { cron: "0 3 * * *", timeZone: "Europe/Berln" }),
    (e) => e.status === 400 && e.field === "time_zone" && e.message.includes("Europe/Berln"),
  );
  await assert.rejects(ca.acquire("bad name", { ttlMs: 1000 }), (e) => e.status === 400 && e.field === "name");
  await assert.rejects(ca.acquire("x", { ttlMs: 1000, waitMs: -1 }), (e) => e.status === 400 && e.field === "wait_ms");
  await assert.rejects(ca.tick("t", { everyMs: 0 }), (e) => {
    assert.ok(e instanceof LeaseholdError);
    assert.equal(e.error, "bad-request");
    assert.equal(e.field, "every_ms");
    assert.ok(e.message.length > 0);
    return true;
  });
  await assert.rejects(ca.post("/v1/leases/x/keepalive", { token: "12x" }), (e) => e.status === 400 && e.field === "token");
});

test("the README's example runs against a sidecar", async () => {
  const out = execFileSync(process.execPath, ["example.mjs"], {
    cwd: join(import.meta.dirname, ".."),
    env: { ...process.env, LEASEHOLD_SIDECAR: a.url },
  }).toString();
  assert.match(out, /^reindex: held with token [0-9]+, valid for [0-9]+ ms$/m);
  assert.equal((out.match(/^expire-gigs: ran$/gm) ?? []).length, 3, out);
  assert.equal((out.match(/^expire-gigs: running slot [0-9]+000 with token [0-9]+$/gm) ?? []).length, 3, out);
});

test("an unreachable sidecar: fail-closed does not run, fail-open runs ungated", async () => {
  const nowhere = "http://127.0.0.1:9";
  let ran = 0;
  const closed = new LeaseholdClient({ baseUrl: nowhere });
  assert.equal(await closed.gate("t", { everyMs: 1000 }, async () => { ran++; }), "sidecar-down");
  assert.equal(ran, 0);
  const open = new LeaseholdClient({ baseUrl: nowhere, onSidecarDown: "fail-open" });
  assert.equal(await open.gate("t", { everyMs: 1000 }, async (run) => {
    ran++;
    assert.equal(run.gated, false);
    assert.equal(run.token, null);
    assert.equal(run.slot % 1000, 0);
    assert.ok(Math.abs(Date.now() - run.slot) < 2000, "the slot by the local clock");
  }), "ran");
  assert.equal(ran, 1);
});

describe("on a redis-server of the test's own", () => {
  let r, x, y, cx, cy;
  before(async () => {
    r = await redis();
    [x, y] = await Promise.all([sidecar(r.url), sidecar(r.url)]);
    cx = new LeaseholdClient({ baseUrl: x.url });
    cy = new LeaseholdClient({ baseUrl: y.url });
  });
  after(async () => {
    await Promise.all([x.stop(), y.stop()]);
    await r.stop();
  });

  test("a group's ticks run on its leader only", async () => {
    const ran = { x: 0, y: 0 };
    const end = Date.now() + 3000;
    while (Date.now() < end) {
      for (const [name, c] of [["x", cx], ["y", cy]]) {
        await c.gate("grouped", { everyMs: 300, group: "workers", ttlMs: 3000 }, async () => { ran[name]++; });
      }
      await sleep(50);
    }
    assert.ok(ran.x + ran.y >= 6, JSON.stringify(ran));
    assert.ok(ran.x === 0 || ran.y === 0, `both ran: ${JSON.stringify(ran)}`);
    const state = await cx.leader("workers");
    assert.ok(state.leader && state.token, JSON.stringify(state));
  });

  test("tokens above 2^53 come as exact strings and keep increasing", async () => {
    // A counter far along (a long-lived name, or a store seeded from a clock far ahead).
    execFileSync("redis-cli", ["-p", String(r.port), "set", "leasehold:{big}:fence", String(2 ** 53)]);
    const first = await cx.acquire("big", { ttlMs: 2000 });
    assert.equal(first.token, "9007199254740993", "2^53 + 1, exact");
    assert.equal(Number(first.token), 2 ** 53, "a JSON number would have been read as 2^53");
    assert.equal((await cy.request("GET", "/v1/leases/big")).token, "9007199254740993");
    assert.equal(await first.release(), true);
    const second = await cy.acquire("big", { ttlMs: 2000 });
    assert.equal(second.token, "9007199254740994");
    assert.ok(BigInt(second.token) > BigInt(first.token));
    await second.release();
  });

  test("store down: ticks fail closed by default, run ungated with fail-open; gated again when it is back", async () => {
    const ran = [];
    const job = (name) => async (run) => {
      assert.equal(run.token === null, run.gated === false, "a token exactly when gated");
      ran.push({ name, gated: run.gated });
    };
    assert.equal(await cx.gate("outage", { everyMs: 200 }, job("x")), "ran");
    await r.stop();
    await sleep(300);
    const closed = await Promise.all([
      cx.gate("outage", { everyMs: 200 }, job("x")),
      cy.gate("outage", { everyMs: 200 }, job("y")),
    ]);
    assert.deepEqual(closed, ["store-down", "store-down"]);
    assert.equal(ran.length, 1, "nothing ran while the store was down");
    const open = await Promise.all([
      cx.gate("outage", { everyMs: 200, onStoreDown: "fail-open" }, job("x")),
      cy.gate("outage", { everyMs: 200, onStoreDown: "fail-open" }, job("y")),
    ]);
    assert.deepEqual(open, ["ran", "ran"], "fail-open: every instance runs, uncoordinated");
    const ungated = ran.slice(1).sort((p, q) => p.name.localeCompare(q.name));
    assert.deepEqual(ungated, [{ name: "x", gated: false }, { name: "y", gated: false }]);
    r = await redis(r.port);
    let result;
    for (let i = 0; i < 50 && result !== "ran"; i++) {
      await sleep(200);
      result = await cx.gate("outage", { everyMs: 200 }, job("x"));
    }
    assert.equal(result, "ran", "gated runs resume once the store is back");
    assert.equal(ran.at(-1).gated, true);
  });
});

test("fleet: a leasehold run task is listed, paused, resumed and triggered through the sidecar", async () => {
  // An instance of the task: `leasehold run --every` registers it in the store's catalog.
  const job = spawn(BIN, ["run", "--store", store, "--lease", "ts-fleet", "--every", "1s", "--ttl", "3s", "--", "true"], {
    stdio: "ignore",
  });
  try {
    let listed;
    for (let i = 0; i < 100 && !listed; i++) {
      listed = (await ca.tasks()).tasks.find((t) => t.name === "ts-fleet:run" && t.instances.some((x) => x.live));
      if (!listed) await sleep(100);
    }
    assert.ok(listed, "the run task is in the catalog");
    assert.equal(listed.definition.source, "run");
    assert.equal(listed.definition.schedule, "every 1s");
    assert.ok(listed.next_slot_ms > 0);
    // The name given to `leasehold run --lease` finds it, on either sidecar.
    const paused = await cb.pause("ts-fleet", { reason: "ts test", by: "node" });
    assert.equal(paused.state === "paused" || paused.state === "running", true, paused.state);
    assert.deepEqual([paused.paused.by, paused.paused.reason], ["node", "ts test"]);
    await sleep(2500);
    const detail = await ca.task("ts-fleet", { limit: 10 });
    assert.ok(detail.history.length <= 10);
    assert.ok(detail.missed.some((m) => m.reason === "paused"), JSON.stringify(detail.missed));
    assert.equal((await ca.resume("ts-fleet")).paused, null);
    const asked = await ca.trigger("ts-fleet", { by: "node" });
    assert.equal(asked.by, "node");
    let manual;
    for (let i = 0; i < 100 && !manual; i++) {
      manual = (await ca.task("ts-fleet")).history.find((r) => r.request?.id === asked.id && r.outcome !== "running");
      if (!manual) await sleep(100);
    }
    assert.ok(manual, "the triggered run is in the history");
    assert.equal(manual.trigger, "manual");
    assert.equal(manual.outcome, "ok");
    const leases = await ca.leases();
    assert.ok(leases.leases.some((l) => l.name === "ts-fleet"), "the run's leader group is a lease");
  } finally {
    job.kill("SIGTERM");
  }
  await assert.rejects(ca.task("no-such-task"), (e) => {
    assert.ok(e instanceof LeaseholdError);
    assert.equal(e.status, 404);
    assert.equal(e.code, "unknown-task");
    return true;
  });
});

test("fleet: a backfill runs each past slot without an ok run once, in order; again, nothing", async () => {
  const job = spawn(BIN, ["run", "--store", store, "--lease", "ts-backfill", "--every", "1s", "--ttl", "3s", "--", "true"], {
    stdio: "ignore",
  });
  try {
    let listed;
    for (let i = 0; i < 100 && !listed; i++) {
      listed = (await ca.tasks()).tasks.find((t) => t.name === "ts-backfill:run" && t.instances.some((x) => x.live));
      if (!listed) await sleep(100);
    }
    assert.ok(listed, "the run task is in the catalog");
    // Three slots from a minute before the instance started: none ran.
    const toMs = Math.floor((Date.now() - 60_000) / 1000) * 1000;
    const fromMs = toMs - 2000;
    const asked = await cb.backfill("ts-backfill", { fromMs, toMs, by: "node" });
    assert.deepEqual(asked.slots, [fromMs, fromMs + 1000, toMs]);
    assert.deepEqual(asked.to_run, asked.slots);
    assert.deepEqual(asked.request.slots, { from_ms: fromMs, to_ms: toMs });
    let runs = [];
    for (let i = 0; i < 100 && runs.length < 3; i++) {
      runs = (await ca.task("ts-backfill", { limit: 100 })).history.filter(
        (r) => r.request?.id === asked.request.id && r.outcome !== "running",
      );
      if (runs.length < 3) await sleep(100);
    }
    assert.deepEqual(runs.map((r) => r.trigger), ["backfill", "backfill", "backfill"]);
    assert.deepEqual(runs.map((r) => r.slot_ms).sort(), asked.slots);
    assert.ok(runs.every((r) => r.outcome === "ok" && r.token !== null));
    const again = await ca.backfill("ts-backfill", { fromMs, toMs });
    assert.equal(again.request, null, "every slot ran ok: nothing asked for");
    assert.deepEqual(again.to_run, []);
    await assert.rejects(ca.backfill("ts-backfill", { fromMs: toMs, toMs: fromMs }), (e) => {
      assert.ok(e instanceof LeaseholdError);
      assert.deepEqual([e.status, e.code], [400, "bad-request"]);
      return true;
    });
  } finally {
    job.kill("SIGTERM");
  }
});

test("fleet: a sidecar task is registered by its ticks and a trigger is taken as a manual run", async () => {
  const schedule = { everyMs: 3_600_000 };
  const first = await ca.tick("ts-side", schedule);
  assert.equal(first.run, true);
  assert.equal(first.trigger, "timer");
  await first.done("ok");
  const listed = (await cb.tasks()).tasks.find((t) => t.name === "ts-side");
  assert.equal(listed?.definition?.source, "sidecar", JSON.stringify(listed));
  assert.equal(listed.definition.schedule, "every 3600s");
  const asked = await cb.trigger("ts-side", { by: "node" });
  // The hourly slot already ran: the next tick runs only because it was asked for.
  const manual = await cb.tick("ts-side", schedule);
  assert.equal(manual.run, true, JSON.stringify(manual));
  assert.equal(manual.trigger, "manual");
  assert.equal(manual.slot, asked.at_ms);
  await manual.done("ok");
  // The outcome is written to the store in the background, after the answer to done.
  let run;
  for (let i = 0; i < 50 && run?.outcome !== "ok"; i++) {
    if (i > 0) await sleep(100);
    run = (await ca.task("ts-side")).history.find((r) => r.request?.id === asked.id);
  }
  assert.equal(run?.outcome, "ok", JSON.stringify(run));
  assert.equal((await ca.tick("ts-side", schedule)).reason, "already-run");
});

test("done keeps the run's output: its end when long, cut at a character boundary", async () => {
  const schedule = { everyMs: 3_600_000 };
  const printed = "step 1\n\u001b[31mred\u001b[0m\n";
  const long = `${"€".repeat(30_000)}THE END`;
  for (const [task, output] of [["ts-output", printed], ["ts-output-long", long]]) {
    const run = await ca.tick(task, schedule);
    assert.equal(run.run, true, JSON.stringify(run));
    await run.done("failed", "boom", output);
    let kept;
    for (let i = 0; i < 50 && typeof kept?.output !== "string"; i++) {
      if (i > 0) await sleep(100);
      kept = (await ca.task(task)).history[0];
    }
    assert.equal(kept?.outcome, "failed", JSON.stringify(kept));
    if (output === printed) assert.equal(kept.output, printed);
    else {
      assert.ok(output.endsWith(kept.output) && kept.output.endsWith("€THE END"));
      assert.ok(new TextEncoder().encode(kept.output).length <= 65536);
      assert.ok(kept.output.length > 21_000, `${kept.output.length}`);
    }
  }
});

test("names with . and .. segments reach the task, lease and group they name", async () => {
  for (const name of [".", "..", "../../etc", "a/./b", "x/..", "/lead", "a//b"]) {
    const run = await ca.tick(name, { everyMs: 3_600_000 });
    assert.equal(run.run, true, `${name}: ${JSON.stringify(run)}`);
    assert.equal(run.task, name);
    await run.done("ok");
    assert.equal((await cb.tick(name, { everyMs: 3_600_000 })).reason, "already-run", name);
    let detail;
    for (let i = 0; i < 50 && detail?.name !== name; i++) {
      if (i > 0) await sleep(100);
      detail = await ca.task(name).catch(() => undefined);
    }
    assert.equal(detail?.name, name);
    assert.equal((await cb.pause(name)).state, "paused", name);
    assert.notEqual((await cb.resume(name)).state, "paused", name);
    const lease = await ca.acquire(name, { ttlMs: 3000 });
    assert.equal(lease?.name, name);
    assert.equal(await cb.acquire(name, { ttlMs: 3000 }), null, `${name} is held`);
    assert.equal(await lease.release(), true);
  }
});
