// docs/clients.md's node-cron and NestJS snippets as written (every second instead of every 5, a 3 s
// ttl), run from the packed tarball installed in a fresh project: three replicas, each beside
// its own sidecar on one SQLite file, the first with its clock 200 ms ahead (faketime):
// - every slot runs once, on one replica, never before it starts on the store's clock and
//   within a second of it (the early replica's fires wait for their slot);
// - `leasehold status` lists the three replicas by their ids (via their sidecars);
// - a replica SIGKILLed in the middle of a run is taken over at the first slot after the ttl,
//   and leaves the
//   status list within the task's idle expiry while its sidecar runs on.
import { before, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawn } from "node:child_process";
import { existsSync, mkdirSync, openSync, readFileSync, readdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";

import { LeaseholdClient } from "../dist/index.js";
import { BIN, sidecar, sleep, tempDir } from "../support/helpers.mjs";

const here = join(import.meta.dirname, "..");
const dir = tempDir();
const app = join(dir, "app");
const TTL = 3000;
const SKEW = "+0.2s";

const npm = (args, cwd) =>
  execFileSync("npm", [...args, "--no-audit", "--no-fund", "--loglevel=error"], { cwd, stdio: "pipe" }).toString();

/** The first `lang` block of docs/clients.md's section `heading`, sped up as the header says. */
function snippet(heading, lang) {
  const page = readFileSync(join(here, "..", "..", "docs", "clients.md"), "utf8");
  const section = page.split(`\n## ${heading}\n`)[1];
  assert.ok(section, `docs/clients.md section ${heading}`);
  const block = section.match(new RegExp("```" + lang + "\\n([\\s\\S]*?)```\\n"))?.[1];
  assert.ok(block, `a ${lang} block in ${heading}`);
  assert.ok(block.includes('"*/5 * * * * *"') && block.includes("10_000"), block);
  return block.replace('"*/5 * * * * *"', '"* * * * * *"').replace("10_000", String(TTL));
}

before(() => {
  // The package as an application gets it: `npm pack` (prepack compiles), installed with the
  // schedulers it plugs into in a project of its own.
  npm(["pack", "--pack-destination", dir], here);
  const tarball = join(dir, readdirSync(dir).find((f) => f.endsWith(".tgz")));
  mkdirSync(app);
  writeFileSync(join(app, "package.json"), JSON.stringify({ name: "replicas", private: true, type: "module" }));
  writeFileSync(
    join(app, "tsconfig.json"),
    JSON.stringify({
      compilerOptions: {
        target: "ES2022",
        module: "NodeNext",
        moduleResolution: "NodeNext",
        experimentalDecorators: true,
        emitDecoratorMetadata: true,
        strict: true,
        skipLibCheck: true,
      },
    }),
  );
  npm(
    [
      "install",
      "--prefer-offline",
      tarball,
      "node-cron@4.6.0",
      "@nestjs/common@11.2.12",
      "@nestjs/core@11.2.12",
      "@nestjs/schedule@6.1.3",
      "reflect-metadata@0.2.2",
      "rxjs@7.8.2",
      "typescript@5.9.3",
      "@types/node@20.9.5",
    ],
    app,
  );
  writeFileSync(join(app, "cron-app.mjs"), snippet("Node: node-cron", "js"));
  writeFileSync(join(app, "nest-app.ts"), snippet("Node: NestJS", "ts"));
  execFileSync(join(app, "node_modules", ".bin", "tsc"), ["-p", "."], { cwd: app, stdio: "pipe" });
});

/** A replica running `script` beside `side`, as `instance`, its clock `skew` ahead if given. */
function replica(script, side, instance, skew) {
  const log = join(dir, `${instance}.log`);
  const out = openSync(log, "a");
  const env = { ...process.env, LEASEHOLD_SIDECAR: side.url, LEASEHOLD_INSTANCE: instance };
  // libfaketime preloaded into node itself (not the faketime wrapper, which a SIGKILL would
  // leave the node process of): the wall clock ahead, timers' monotonic clock as it is.
  if (skew) Object.assign(env, { LD_PRELOAD: libfaketime(), FAKETIME: skew, FAKETIME_DONT_FAKE_MONOTONIC: "1" });
  const child = spawn(process.execPath, [script], { cwd: app, env, stdio: ["ignore", out, out] });
  return {
    instance,
    child,
    /** The slots this replica ran, from its `expire-gigs: slot S, token T` lines. */
    slots: () => [...readFileSync(log, "utf8").matchAll(/^expire-gigs: slot (\d+), token \d+$/gm)].map((m) => Number(m[1])),
    log: () => readFileSync(log, "utf8"),
    stop(signal) {
      return new Promise((ok) => {
        if (child.exitCode !== null || child.signalCode !== null) return ok();
        child.once("exit", () => ok());
        child.kill(signal);
      });
    },
  };
}

/** libfaketime (Debian's faketime package; scripts/stores.sh installs it). */
function libfaketime() {
  for (const arch of readdirSync("/usr/lib")) {
    const lib = join("/usr/lib", arch, "faketime", "libfaketime.so.1");
    if (existsSync(lib)) return lib;
  }
  throw new Error("libfaketime.so.1 not found under /usr/lib/*/faketime: apt-get install faketime");
}

const status = (store) => execFileSync(BIN, ["status", "--store", store]).toString();

async function threeReplicas(kind, script) {
  const store = `sqlite:${join(dir, `${kind}.db`)}`;
  const sides = await Promise.all([1, 2, 3].map(() => sidecar(store)));
  const replicas = [1, 2, 3].map((n) => replica(script, sides[n - 1], `${kind}-replica-${n}`, n === 1 ? SKEW : undefined));
  const client = new LeaseholdClient({ baseUrl: sides[1].url, instance: "the-test" });
  try {
    await sleep(6000);
    const ran = replicas.flatMap((r) => r.slots().map((slot) => ({ slot, by: r.instance })));
    const logs = () => replicas.map((r) => `${r.instance}:\n${r.log()}`).join("\n");
    assert.ok(ran.length >= 4, `runs: ${JSON.stringify(ran)}\n${logs()}`);
    const slots = ran.map((r) => r.slot).sort((a, b) => a - b);
    assert.equal(new Set(slots).size, slots.length, `no slot twice: ${JSON.stringify(ran)}`);
    for (let i = 1; i < slots.length; i++) assert.equal(slots[i] - slots[i - 1], 1000, `no slot missed: ${slots}`);

    // On time on the store's clock, although the first replica fires 200 ms early.
    const { history } = await client.task("expire-gigs", { limit: 100 });
    const runs = history.filter((h) => h.missed === null && h.slot_ms !== null);
    assert.ok(runs.length >= slots.length - 1, JSON.stringify(history));
    for (const r of runs) {
      const late = r.started_ms - r.slot_ms;
      assert.ok(late >= 0 && late < 1000, `slot ${r.slot_ms} started ${late} ms after it: ${JSON.stringify(r)}`);
      assert.match(r.holder, new RegExp(`^${kind}-replica-[123]@`), "the holder names the replica");
    }

    // The three replicas by their ids, each via its sidecar.
    const listed = status(store);
    for (const r of replicas) assert.match(listed, new RegExp(`\\b${r.instance} via `), listed);

    // SIGKILL of the replica in the middle of a run (300 ms each): the slot's lease stays
    // until its ttl, then another replica runs the next slot.
    const victim = replicas[0].slots().length > 0 ? replicas[0] : replicas.find((r) => r.slots().length > 0);
    const seen = victim.slots().length;
    while (victim.slots().length === seen) await sleep(10);
    const killedAt = Date.now();
    await victim.stop("SIGKILL");
    const killedSlot = victim.slots().at(-1);
    const others = replicas.filter((r) => r !== victim);
    let takeover;
    while (takeover === undefined && Date.now() - killedAt < TTL + 3000) {
      await sleep(50);
      takeover = others.flatMap((r) => r.slots()).filter((s) => s > killedSlot).sort((a, b) => a - b)[0];
    }
    assert.ok(takeover !== undefined, `no takeover after the kill\n${logs()}`);
    const after = (await client.task("expire-gigs", { limit: 100 })).history.find((h) => h.slot_ms === takeover);
    // The killed run's lease runs out at most a ttl after the kill; the first slot after that
    // runs elsewhere (a slot is a second here; 500 ms for the fire and the tick).
    const takenOverMs = after.started_ms - killedAt;
    assert.ok(takenOverMs <= TTL + 1000 + 500, `taken over ${takenOverMs} ms after the kill`);

    // The killed replica leaves the list within the idle expiry (2 × 1 s + the ttl) and a
    // heartbeat; the others stay, and so does its sidecar.
    await sleep(2 * 1000 + TTL + 1500);
    const later = status(store);
    assert.doesNotMatch(later, new RegExp(`\\b${victim.instance} via `), later);
    for (const r of others) assert.match(later, new RegExp(`\\b${r.instance} via `), later);
    const all = replicas.flatMap((r) => r.slots()).sort((a, b) => a - b);
    assert.equal(new Set(all).size, all.length, `no slot twice: ${all}`);
  } finally {
    await Promise.all(replicas.map((r) => r.stop("SIGKILL")));
    await Promise.all(sides.map((s) => s.stop()));
  }
}

test("node-cron: three replicas, one 200 ms ahead, every slot once, on time; a SIGKILL is taken over", async () => {
  await threeReplicas("cron", "cron-app.mjs");
});

test("NestJS: three replicas, one 200 ms ahead, every slot once, on time; a SIGKILL is taken over", async () => {
  await threeReplicas("nest", "nest-app.js");
});

