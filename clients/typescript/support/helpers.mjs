// Real processes for the tests: `leasehold serve` sidecars and a redis-server of the test's own.
import { spawn, execFileSync } from "node:child_process";
import { mkdtempSync, openSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";

export const BIN = resolve(import.meta.dirname, "..", process.env.LEASEHOLD_BIN ?? "../../target/debug/leasehold");

export function tempDir() {
  return mkdtempSync(join(tmpdir(), "leasehold-ts-"));
}

export function freePort() {
  return new Promise((ok, fail) => {
    const server = createServer();
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => ok(port));
    });
    server.on("error", fail);
  });
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function until(what, check, limitMs = 15000) {
  const deadline = Date.now() + limitMs;
  for (;;) {
    if (await check().catch(() => false)) return;
    if (Date.now() > deadline) throw new Error(`${what} did not come up`);
    await sleep(50);
  }
}

/** A `leasehold serve` process on a free port; `url`, `stop(signal)`. `log`: a file for stderr. */
export async function sidecar(store, extra = [], log) {
  const port = await freePort();
  const stderr = log ? openSync(log, "a") : "inherit";
  const child = spawn(BIN, ["serve", "--store", store, "--listen", `127.0.0.1:${port}`, ...extra], {
    stdio: ["ignore", "ignore", stderr],
  });
  const url = `http://127.0.0.1:${port}`;
  await until("sidecar", async () => (await fetch(`${url}/healthz`)).ok);
  return {
    url,
    child,
    stop(signal = "SIGTERM") {
      return new Promise((ok) => {
        if (child.exitCode !== null || child.signalCode !== null) return ok(child.exitCode);
        child.once("exit", (code) => ok(code));
        child.kill(signal);
      });
    },
  };
}

/** A redis-server of the test's own on `port` (default a free one), killed by `stop`. */
export async function redis(port) {
  port ??= await freePort();
  const child = spawn(
    "redis-server",
    ["--port", String(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
    { stdio: "ignore" },
  );
  await until("redis-server", async () => {
    execFileSync("redis-cli", ["-p", String(port), "ping"], { stdio: "pipe" });
    return true;
  });
  return {
    url: `redis://127.0.0.1:${port}`,
    port,
    stop() {
      return new Promise((ok) => {
        if (child.exitCode !== null || child.signalCode !== null) return ok();
        child.once("exit", () => ok());
        child.kill("SIGKILL");
      });
    },
  };
}

export { sleep };
