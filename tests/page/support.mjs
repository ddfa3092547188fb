// What the browser tests share: the leasehold processes they start (killed at the end), free
// ports, polling, and a leasehold sidecar to start and wait for. scripts/page-test.sh sets
// LEASEHOLD_BIN, CHROMIUM and PAGE_TEST_OUT.
import { spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import assert from "node:assert/strict";

export const BIN = process.env.LEASEHOLD_BIN;
export const CHROMIUM = process.env.CHROMIUM || "/usr/bin/chromium";
export const OUT = process.env.PAGE_TEST_OUT || "target/page-test";

assert.ok(BIN, "LEASEHOLD_BIN must name the leasehold binary");
mkdirSync(OUT, { recursive: true });

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export function freePort() {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address();
      server.close(() => resolve(port));
    });
    server.on("error", reject);
  });
}

/** Polls `check` until it returns something truthy (its value), failing past `limitMs`. */
export async function until(what, check, limitMs) {
  const end = Date.now() + limitMs;
  let last;
  for (;;) {
    try {
      const got = await check();
      if (got) return got;
    } catch (e) { last = e; }
    if (Date.now() > end) throw new Error(`${what}: not within ${limitMs} ms${last ? ` (${last.message})` : ""}`);
    await sleep(100);
  }
}

/** A temporary directory and the leasehold processes a test starts in it. */
export class Processes {
  constructor(prefix) {
    this.dir = mkdtempSync(join(tmpdir(), prefix));
    this.children = [];
  }

  /** Starts `leasehold ARGS`; its stderr's tail is printed if it exits unexpectedly. */
  start(args, name) {
    const child = spawn(BIN, args, { cwd: this.dir, stdio: ["ignore", "ignore", "pipe"] });
    let log = "";
    child.stderr.on("data", (d) => { log = (log + d).slice(-4000); });
    child.on("exit", (code, signal) => {
      if (!child.expectedExit && process.exitCode === undefined) {
        console.error(`${name} exited (${code ?? signal}) early:\n${log}`);
      }
    });
    this.children.push(child);
    return child;
  }

  /** `leasehold serve --store STORE --listen 127.0.0.1:PORT ARGS`, once `/healthz` answers. */
  async serve(store, args = []) {
    const port = await freePort();
    this.start(["serve", "--store", store, "--listen", `127.0.0.1:${port}`, ...args], `serve :${port}`);
    const base = `http://127.0.0.1:${port}`;
    await until(`the sidecar on ${port} answers`, async () => (await fetch(`${base}/healthz`)).ok, 20000);
    return { port, base };
  }

  /** SIGTERM to every process, SIGKILL to those left after half a second; the directory goes. */
  async stop() {
    for (const c of this.children) {
      c.expectedExit = true;
      if (c.exitCode === null) c.kill("SIGTERM");
    }
    await sleep(500);
    for (const c of this.children) if (c.exitCode === null) c.kill("SIGKILL");
    rmSync(this.dir, { recursive: true, force: true });
  }
}

/** Runs `main`, printing its failure and setting the exit code; `procs` are stopped after. */
export async function runTest(name, procs, main) {
  try {
    await main();
    console.log(`${name} passed`);
  } catch (e) {
    console.error(`${name} FAILED: ${e.stack || e}`);
    process.exitCode = 1;
  } finally {
    await procs.stop();
  }
}
