// The client as a package, used the way the README says: `npm pack` (its `prepack` compiles
// it), the tarball installed in an application outside the repository, and the README's
// snippet run there as written, against a real sidecar.
import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync, spawnSync } from "node:child_process";
import { cpSync, mkdirSync, readdirSync, readFileSync, symlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";

import { sidecar, tempDir } from "../support/helpers.mjs";

const here = join(import.meta.dirname, "..");
const dir = tempDir();
let side;

before(async () => {
  side = await sidecar(`sqlite:${join(dir, "leases.db")}`);
});

after(async () => {
  await side.stop();
});

const npm = (args, cwd) =>
  execFileSync("npm", [...args, "--no-audit", "--no-fund", "--loglevel=error"], { cwd, stdio: "pipe" }).toString();

/** The README's first `js` block: the snippet an application copies. */
function readmeSnippet() {
  const readme = readFileSync(join(here, "README.md"), "utf8");
  const block = readme.match(/```js\n([\s\S]*?)```\n/);
  assert.ok(block, "a js block in the README");
  return block[1];
}

test("npm pack makes an installable package, and the README's snippet runs from it", () => {
  // Pack a copy of the sources without `dist`, as a fresh clone has them: the tarball must
  // carry the compiled client all the same.
  const src = join(dir, "client");
  mkdirSync(src);
  for (const f of ["package.json", "package-lock.json", "tsconfig.json", "README.md", "src"]) {
    cpSync(join(here, f), join(src, f), { recursive: true });
  }
  symlinkSync(join(here, "node_modules"), join(src, "node_modules"));
  npm(["pack", "--pack-destination", dir], src);
  const tarball = readdirSync(dir).find((f) => f.endsWith(".tgz"));
  // Named by the package's version, which is the release's (the crates' workspace version),
  // as the README's install lines say.
  const { version } = JSON.parse(readFileSync(join(here, "package.json"), "utf8"));
  assert.equal(tarball, `leasehold-client-${version}.tgz`);
  const cargo = readFileSync(join(here, "..", "..", "Cargo.toml"), "utf8");
  assert.equal(version, cargo.match(/\[workspace\.package\][^[]*?\nversion = "([^"]+)"/)?.[1]);
  assert.ok(readFileSync(join(here, "README.md"), "utf8").includes(tarball), `the README names ${tarball}`);
  const listing = execFileSync("tar", ["tzf", join(dir, tarball)]).toString();
  assert.match(listing, /^package\/dist\/index\.js$/m);
  assert.match(listing, /^package\/dist\/index\.d\.ts$/m);

  // An application of its own, outside the repository, installs the tarball.
  const app = join(dir, "app");
  mkdirSync(app);
  writeFileSync(join(app, "package.json"), JSON.stringify({ name: "app", private: true, type: "module" }));
  npm(["install", "--offline", join(dir, tarball)], app);

  // The snippet as written, with the application's own functions around it, time sped up
  // (every setInterval fires each 100 ms), a sweep slower than that, and the second `gate`
  // call made to reject.
  const harness = `
import * as client from "@leasehold/client";
const realSetInterval = globalThis.setInterval;
globalThis.setInterval = (fn) => realSetInterval(fn, 100);
let calls = 0, inFlight = 0, maxInFlight = 0;
const gate = client.LeaseholdClient.prototype.gate;
client.LeaseholdClient.prototype.gate = function (...args) {
  calls++;
  if (calls === 2) return Promise.reject(new Error("injected rejection"));
  inFlight++;
  maxInFlight = Math.max(maxInFlight, inFlight);
  return gate.apply(this, args).finally(() => inFlight--);
};
async function reindex({ signal, fencingToken }) {
  console.log("reindex ran with token", fencingToken, "aborted", signal.aborted);
}
async function expireGigs({ fencingToken }) {
  console.log("expire-gigs ran with token", fencingToken);
  await new Promise((r) => setTimeout(r, 600));
}
setTimeout(() => {
  console.log(JSON.stringify({ calls, maxInFlight }));
  process.exit(0);
}, 2500);
`;
  // The harness first: its statements run before the snippet's (imports are hoisted anyway).
  writeFileSync(join(app, "main.mjs"), `${harness}\n${readmeSnippet()}`);
  const run = spawnSync(process.execPath, ["main.mjs"], {
    cwd: app,
    env: { ...process.env, LEASEHOLD_SIDECAR: side.url },
    timeout: 20_000,
  });
  const out = run.stdout.toString();
  const err = run.stderr.toString();
  assert.equal(run.status, 0, `${out}\n${err}`);
  assert.match(out, /^reindex ran with token [0-9]+ aborted false$/m);
  assert.match(out, /^expire-gigs ran with token [0-9]+$/m);
  assert.match(err, /^expire-gigs: Error: injected rejection/m, "the rejection was caught and logged");
  const { calls, maxInFlight } = JSON.parse(out.trim().split("\n").at(-1));
  assert.equal(maxInFlight, 1, "no two gate calls at once");
  // About 24 ticks in 2.4 s; the ones during the 600 ms sweep were skipped.
  assert.ok(calls >= 5 && calls <= 20, `${calls} gate calls`);
});
