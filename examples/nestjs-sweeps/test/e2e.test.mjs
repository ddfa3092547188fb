// Three replicas of the NestJS service, each with its own sidecar, all on one Redis of the
// test's own (1 s interval, 3 s task-lease ttl). Checked from the ledger the sweeps write (a line
// when a sweep starts, another when it ends) and from the run history in Redis:
// - no slot of either sweep ever starts twice, and none is missed in normal operation;
// - SIGTERM of a replica in the middle of a sweep (app, then its sidecar): the sweep finishes and
//   is reported done (history: ok), and the next slot runs on another replica at once;
// - SIGKILL of a replica and its sidecar in the middle of a sweep: the others resume within the
//   task lease's ttl;
// - Redis killed: with the default fail-closed policy no sweep starts while it is down, and
//   sweeps resume once it is back.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { existsSync, openSync, readFileSync } from "node:fs";
import { join } from "node:path";

import { BIN, redis, sidecar, sleep, tempDir } from "../../../clients/typescript/support/helpers.mjs";

const INTERVAL = 1000;
const TTL = 3000;
const WORK = 300;
const WORKERS = ["gig-expiry", "repin"];

function startApp(name, sidecarUrl, ledger, log) {
  const out = openSync(log, "a");
  const child = spawn(process.execPath, ["dist/main.js"], {
    env: {
      ...process.env,
      LEASEHOLD_SIDECAR: sidecarUrl,
      LEDGER: ledger,
      REPLICA: name,
      // The replica's id in the catalog and in holders (its sidecar's is `--holder NAME`).
      LEASEHOLD_INSTANCE: `${name}-app`,
      SWEEP_INTERVAL_MS: String(INTERVAL),
      // repin on a cron schedule in a zone with a 30-minute daylight-saving change: every
      // second, the same slots as the interval, through the client's cron + timeZone.
      REPIN_CRON: "* * * * * *",
      REPIN_TIME_ZONE: "Australia/Lord_Howe",
      WORK_MS: String(WORK),
      LEASE_TTL_MS: String(TTL),
      LOG_TICKS: "1",
      NO_COLOR: "1",
    },
    stdio: ["ignore", out, out],
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
const starts = (lines, worker) => lines.filter((l) => l.phase === "start" && (!worker || l.worker === worker));
const ends = (lines, worker) => lines.filter((l) => l.phase === "end" && (!worker || l.worker === worker));

/** Slots due in [from, to) (slot times, ms) that no sweep started. */
function missing(lines, worker, from, to) {
  const ran = new Set(starts(lines, worker).map((l) => l.slot));
  const out = [];
  for (let s = Math.ceil(from / INTERVAL) * INTERVAL; s < to; s += INTERVAL) if (!ran.has(s)) out.push(s);
  return out;
}

/** Waits until a sweep of one of `replicas` has started and not ended; returns its start line. */
async function sweepInProgress(ledger, replicas, limitMs = 10_000) {
  const names = new Set(replicas.map((r) => r.name));
  const deadline = Date.now() + limitMs;
  while (Date.now() < deadline) {
    const lines = read(ledger);
    const ended = new Set(ends(lines).map((l) => `${l.worker}/${l.slot}`));
    const open = starts(lines).filter((l) => names.has(l.replica) && !ended.has(`${l.worker}/${l.slot}`));
    // Not one about to end: at least WORK/3 ms left.
    const fresh = open.find((l) => Date.now() - l.start < (2 * WORK) / 3);
    if (fresh) return fresh;
    await sleep(15);
  }
  throw new Error("no sweep in progress");
}

function history(storeUrl, worker) {
  const out = execFileSync(BIN, ["history", "--store", storeUrl, worker, "--json", "--limit", "1000"]);
  return JSON.parse(out.toString()).runs;
}

test("3 replicas + 3 sidecars on one Redis: one sweep per slot through SIGTERM, SIGKILL and a store outage", { timeout: 120_000 }, async () => {
  const dir = tempDir();
  const ledger = join(dir, "sweeps.ledger");
  let store = await redis();
  const replicas = [];
  for (const name of ["r1", "r2", "r3"]) {
    const sc = await sidecar(store.url, ["--holder", name], join(dir, `${name}-sidecar.log`));
    replicas.push({ name, sidecar: sc, app: startApp(name, sc.url, ledger, join(dir, `${name}-app.log`)) });
  }
  const report = {};
  try {
    // Nest starts in about a second, and an @Interval first fires an interval after that.
    await sleep(3000);
    const t0 = Date.now();
    await sleep(4000);

    // SIGTERM a replica in the middle of a sweep: Nest's shutdown hook stops its timers, lets
    // the sweep finish and report done, and the app exits; then its sidecar releases the rest.
    const termed = await sweepInProgress(ledger, replicas);
    const leaving = replicas.find((r) => r.name === termed.replica);
    const t1 = Date.now();
    // Nest runs its shutdown hooks, then re-raises the signal.
    assert.ok([0, "SIGTERM"].includes(await leaving.app.stop("SIGTERM")), "the app exits on SIGTERM");
    const appExited = Date.now();
    assert.equal(await leaving.sidecar.stop("SIGTERM"), 0, "the sidecar exits 0 on SIGTERM");
    await sleep(4000);

    // SIGKILL another replica, app and sidecar together, in the middle of a sweep: its run's
    // lease stays in Redis until its ttl runs out.
    const live = replicas.filter((r) => r !== leaving);
    const killedRun = await sweepInProgress(ledger, live);
    const killed = live.find((r) => r.name === killedRun.replica);
    const t2 = Date.now();
    await Promise.all([killed.app.stop("SIGKILL"), killed.sidecar.stop("SIGKILL")]);
    await sleep(TTL + 3000);
    // The orchestrator starts a replacement (new sidecar, new app) for the outage phase.
    const sc4 = await sidecar(store.url, ["--holder", "r4"], join(dir, "r4-sidecar.log"));
    replicas.push({ name: "r4", sidecar: sc4, app: startApp("r4", sc4.url, ledger, join(dir, "r4-app.log")) });
    await sleep(2000);

    // The history, before Redis (which keeps nothing on disk) goes away.
    const histories = Object.fromEntries(WORKERS.map((w) => [w, history(store.url, w)]));
    // repin's runs are recorded with their cron expression and its zone.
    assert.deepEqual(histories.repin[0].schedule, { cron: "CRON_TZ=Australia/Lord_Howe * * * * * *" });
    const t3 = Date.now();

    // Redis goes away (killed), then comes back on the same port, empty.
    await store.stop();
    await sleep(4000);
    const t4 = Date.now();
    store = await redis(store.port);
    await sleep(6000);
    const t5 = Date.now();

    const lines = read(ledger);
    for (const worker of WORKERS) {
      // One start per slot, but for a slot whose run was cut off by the SIGKILL: the sidecars
      // run it again (at least once), as attempt 2 with trigger `retry`, on another replica.
      const firsts = new Map();
      for (const s of starts(lines, worker)) {
        const earlier = firsts.get(s.slot);
        if (earlier === undefined) firsts.set(s.slot, s);
        else
          assert.ok(
            earlier.replica === killed.name && s.trigger === "retry" && s.attempt > 1 && s.replica !== killed.name,
            `${worker}: slot ${s.slot} started twice: ${JSON.stringify(earlier)} then ${JSON.stringify(s)}`,
          );
      }
      // Every sweep that started ended (the SIGTERMed one and those running when Redis died
      // included), but those in progress on the SIGKILLed replica, and the last, still running.
      for (const s of starts(lines, worker).filter((l) => l.start < t5 - WORK - 500)) {
        const wasKilled = s.replica === killed.name && s.start > t2 - WORK - 500;
        const end = ends(lines, worker).find((e) => e.slot === s.slot && e.token === s.token);
        if (!wasKilled) assert.ok(end, `${worker} slot ${s.slot} on ${s.replica} never ended`);
        if (end) assert.equal(end.replica, s.replica);
      }
      // Normal operation, and across the SIGTERM handover: nothing missed.
      assert.deepEqual(missing(lines, worker, t0, t2 - INTERVAL), [], `${worker}: missed before the kill (SIGTERM at ${t1})`);
      // After the SIGTERM, the first slot ran elsewhere promptly.
      const lastOfLeaving = Math.max(...starts(lines, worker).filter((l) => l.replica === leaving.name).map((l) => l.slot));
      const next = starts(lines, worker).filter((l) => l.slot > lastOfLeaving).sort((p, q) => p.slot - q.slot)[0];
      assert.ok(next && next.replica !== leaving.name, `${worker}: next slot after SIGTERM: ${JSON.stringify(next)}`);
      assert.ok(next.start - next.slot < 2 * INTERVAL, `${worker}: slot ${next.slot} started ${next.start - next.slot} ms late`);
      // After the SIGKILL: at most the slots the dead replica's run lease blocked (its ttl).
      const afterKill = missing(lines, worker, t2, t3 - INTERVAL);
      assert.ok(afterKill.length <= TTL / INTERVAL + 1, `${worker}: ${afterKill.length} missed after SIGKILL`);
      const firstAfterKill = Math.min(...starts(lines, worker).filter((l) => l.start > t2).map((l) => l.start));
      assert.ok(firstAfterKill - t2 <= TTL + 2 * INTERVAL, `${worker}: resumed ${firstAfterKill - t2} ms after SIGKILL`);
      // Then steady again. (At most one slot: until the replacement joins, one replica ticks
      // alone, and its setInterval drifts a millisecond or so per tick, so a tick can cross a
      // slot boundary and skip that slot; with two or more replicas another one covers it.)
      const later = missing(lines, worker, t2 + TTL + 2 * INTERVAL, t3 - INTERVAL);
      assert.ok(later.length <= 1, `${worker}: missed ${later} after resuming from SIGKILL`);
      // Every completed sweep up to then is in the run history as ok, by the replica's sidecar:
      // done was called (the SIGTERMed replica's last sweep included).
      for (const e of ends(lines, worker).filter((e) => e.end < t3 - 500)) {
        const h = histories[worker].find((h) => h.slot === e.slot && String(h.token) === String(e.token));
        assert.ok(h, `${worker} slot ${e.slot} (${e.replica}) not in the history`);
        assert.equal(h.outcome, "ok");
        assert.match(h.holder, new RegExp(`^${e.replica}-app@${e.replica}#`), "the app replica, via its sidecar");
      }
      // Store down, fail-closed: no sweep starts while Redis is gone.
      const during = starts(lines, worker).filter((l) => l.start > t3 + 300 && l.start < t4);
      assert.deepEqual(during, [], `${worker}: started while the store was down`);
      // And they resume once it is back.
      const resumed = starts(lines, worker).filter((l) => l.start > t4);
      assert.ok(resumed.length >= 2, `${worker}: ${resumed.length} sweeps in the ${t5 - t4} ms after Redis came back`);
      report[worker] = {
        nextAfterSigterm: { slot: next.slot, replica: next.replica, lateMs: next.start - next.slot, afterExitMs: next.start - appExited },
        missedAfterSigkill: afterKill.length,
        rerunAfterSigkill: starts(lines, worker).filter((l) => l.trigger === "retry").map((l) => l.slot),
        firstAfterSigkillMs: firstAfterKill - t2,
        firstAfterRedisBackMs: Math.min(...resumed.map((l) => l.start)) - t4,
      };
    }
    // The sweep in progress at SIGTERM finished (and is in the history: checked above).
    assert.ok(ends(lines).some((e) => e.worker === termed.worker && e.slot === termed.slot && e.replica === leaving.name));
    const byReplica = {};
    for (const l of starts(lines)) byReplica[l.replica] = (byReplica[l.replica] ?? 0) + 1;
    console.log(
      `sweeps per replica: ${JSON.stringify(byReplica)}; SIGTERM ${leaving.name} mid-${termed.worker}, ` +
        `SIGKILL ${killed.name} mid-${killedRun.worker}; ${JSON.stringify(report)}`,
    );
  } finally {
    for (const r of replicas) {
      await r.app.stop("SIGKILL");
      await r.sidecar.stop("SIGKILL");
    }
    await store.stop();
  }
});
