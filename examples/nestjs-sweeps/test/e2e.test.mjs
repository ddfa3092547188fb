// Three replicas of the NestJS service, each with its own sidecar, all on one Redis of the
// test's own. Checked from the ledger the sweeps write:
// - every slot of both sweeps runs exactly once (never twice, over the whole run);
// - SIGTERM of the replica that ran the latest slot (app, then its sidecar) hands over at once:
//   no slot is missed around it;
// - SIGKILL of a replica and its sidecar mid-run: the others resume within the task lease's ttl;
// - Redis unreachable: with the default fail-closed policy no sweep starts while it is down, and
//   sweeps resume once it is back.
import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";

import { redis, sidecar, sleep, tempDir } from "../../../clients/typescript/support/helpers.mjs";

const INTERVAL = 1000;
const TTL = 3000;
const WORKERS = ["gig-expiry", "repin"];

function startApp(name, sidecarUrl, ledger, dir) {
  const child = spawn(process.execPath, ["dist/main.js"], {
    env: {
      ...process.env,
      LEASEHOLD_SIDECAR: sidecarUrl,
      LEDGER: ledger,
      REPLICA: name,
      SWEEP_INTERVAL_MS: String(INTERVAL),
      WORK_MS: "200",
      LEASE_TTL_MS: String(TTL),
    },
    stdio: ["ignore", "ignore", "inherit"],
  });
  return {
    name,
    child,
    stop(signal) {
      return new Promise((ok) => {
        if (child.exitCode !== null || child.signalCode !== null) return ok(child.exitCode ?? child.signalCode);
        child.once("exit", (code, sig) => ok(code ?? sig));
        child.kill(signal);
      });
    },
  };
}

const read = (ledger) =>
  existsSync(ledger)
    ? readFileSync(ledger, "utf8").split("\n").filter(Boolean).map((l) => JSON.parse(l))
    : [];

/** The slots of `worker` that ran, sorted. */
const slotsOf = (runs, worker) => runs.filter((r) => r.worker === worker).map((r) => r.slot).sort((a, b) => a - b);

/** Slots due in [from, to) (slot times, ms) that did not run. */
function missing(runs, worker, from, to) {
  const ran = new Set(slotsOf(runs, worker));
  const out = [];
  for (let s = Math.ceil(from / INTERVAL) * INTERVAL; s < to; s += INTERVAL) if (!ran.has(s)) out.push(s);
  return out;
}

test("3 replicas + 3 sidecars on one Redis: one sweep per slot through SIGTERM, SIGKILL and a store outage", { timeout: 120_000 }, async () => {
  const dir = tempDir();
  const ledger = join(dir, "sweeps.ledger");
  let store = await redis();
  const replicas = [];
  for (const name of ["r1", "r2", "r3"]) {
    const sc = await sidecar(store.url, ["--holder", name], join(dir, `${name}-sidecar.log`));
    replicas.push({ name, sidecar: sc, app: startApp(name, sc.url, ledger, dir) });
  }
  try {
    await sleep(1500);
    const t0 = Date.now();
    await sleep(5000);

    // SIGTERM the replica that ran the latest slot: its app finishes the sweep and exits, then
    // its sidecar releases what it holds.
    const latest = read(ledger).sort((a, b) => b.slot - a.slot)[0];
    const leaving = replicas.find((r) => r.name === latest.replica);
    const t1 = Date.now();
    // Nest runs its shutdown hooks, then re-raises the signal.
    assert.ok([0, "SIGTERM"].includes(await leaving.app.stop("SIGTERM")), "the app exits on SIGTERM");
    assert.equal(await leaving.sidecar.stop("SIGTERM"), 0);
    await sleep(4000);

    // SIGKILL another replica, app and sidecar together, while it may be mid-sweep.
    const live = replicas.filter((r) => r !== leaving);
    const latest2 = read(ledger).sort((a, b) => b.slot - a.slot)[0];
    const killed = live.find((r) => r.name === latest2.replica) ?? live[0];
    const t2 = Date.now();
    await Promise.all([killed.app.stop("SIGKILL"), killed.sidecar.stop("SIGKILL")]);
    await sleep(TTL + 4000);

    // Redis goes away (killed), then comes back on the same port.
    const t3 = Date.now();
    await store.stop();
    await sleep(4000);
    const t4 = Date.now();
    store = await redis(store.port);
    await sleep(6000);
    const t5 = Date.now();

    const runs = read(ledger);
    for (const worker of WORKERS) {
      const slots = slotsOf(runs, worker);
      assert.equal(new Set(slots).size, slots.length, `${worker}: a slot ran twice`);
      // Normal operation, and across the SIGTERM handover: nothing missed.
      assert.deepEqual(missing(runs, worker, t0, t2 - INTERVAL), [], `${worker}: missed before the kill (SIGTERM at ${t1})`);
      // After the SIGKILL: at most the slots the dead replica's run lease blocked (its ttl).
      const afterKill = missing(runs, worker, t2, t3 - INTERVAL);
      assert.ok(afterKill.length <= TTL / INTERVAL + 1, `${worker}: ${afterKill.length} missed after SIGKILL`);
      assert.deepEqual(missing(runs, worker, t2 + TTL + 2 * INTERVAL, t3 - INTERVAL), [], `${worker}: not resumed after SIGKILL`);
      // Store down, fail-closed: no sweep starts while Redis is gone.
      const during = runs.filter((r) => r.worker === worker && r.start > t3 + 300 && r.start < t4);
      assert.deepEqual(during, [], `${worker}: ran while the store was down`);
      // And they resume once it is back.
      const resumed = runs.filter((r) => r.worker === worker && r.start > t4);
      assert.ok(resumed.length >= 2, `${worker}: ${resumed.length} runs in the ${t5 - t4} ms after Redis came back`);
    }
    const byReplica = {};
    for (const r of runs) byReplica[r.replica] = (byReplica[r.replica] ?? 0) + 1;
    console.log(`runs per replica: ${JSON.stringify(byReplica)}; SIGTERM ${leaving.name}, SIGKILL ${killed.name}`);
  } finally {
    for (const r of replicas) {
      await r.app.stop("SIGKILL");
      await r.sidecar.stop("SIGKILL");
    }
    await store.stop();
  }
});
