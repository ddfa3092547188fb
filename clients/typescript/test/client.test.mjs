// The client against real sidecars: a SQLite file shared by two sidecars, and one Redis test.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { join } from "node:path";

import { LeaseholdClient, LeaseholdError } from "../dist/index.js";
import { BIN, redis, sidecar, sleep, tempDir } from "../support/helpers.mjs";

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
  await new Promise((ok) => orphan.signal.addEventListener("abort", ok, { once: true }));
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

test("one run per slot across two sidecars, and done feeds the history", async () => {
  const runs = [];
  const end = Date.now() + 3500;
  while (Date.now() < end) {
    for (const [name, c] of [["a", ca], ["b", cb]]) {
      const result = await c.gate("ts-sweep", { everyMs: 500 }, async (run) => {
        runs.push({ slot: run.slot, name });
      });
      assert.ok(["ran", "already-run", "busy"].includes(result), result);
    }
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
});

test("bad input is a 400 naming the field", async () => {
  await assert.rejects(ca.acquire("x", { ttlMs: 5 }), (e) => e.status === 400 && e.field === "ttl_ms");
  await assert.rejects(ca.tick("t", { cron: "not cron" }), (e) => e.status === 400 && e.field === "cron");
  await assert.rejects(ca.acquire("bad name", { ttlMs: 1000 }), (e) => e.status === 400 && e.field === "name");
});

test("an unreachable sidecar: fail-closed does not run, fail-open runs ungated", async () => {
  const nowhere = "http://127.0.0.1:9";
  let ran = 0;
  const closed = new LeaseholdClient({ baseUrl: nowhere });
  assert.equal(await closed.gate("t", { everyMs: 1000 }, async () => { ran++; }), "sidecar-down");
  assert.equal(ran, 0);
  const open = new LeaseholdClient({ baseUrl: nowhere, onSidecarDown: "fail-open" });
  assert.equal(await open.gate("t", { everyMs: 1000 }, async (run) => { ran++; assert.equal(run.gated, false); }), "ran");
  assert.equal(ran, 1);
});

test("on Redis: a group's ticks run on its leader only", async () => {
  const r = await redis();
  const [x, y] = await Promise.all([sidecar(r.url), sidecar(r.url)]);
  const cx = new LeaseholdClient({ baseUrl: x.url });
  const cy = new LeaseholdClient({ baseUrl: y.url });
  try {
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
  } finally {
    await Promise.all([x.stop(), y.stop()]);
    await r.stop();
  }
});
