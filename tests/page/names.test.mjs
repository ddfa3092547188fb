// Every valid name opens on the page (issue 36 item 4), in a real browser: names are
// `A-Z a-z 0-9 - _ . : /`, so `.` and `..` segments (`../../etc`) are valid, and a browser
// resolves such segments in an address away, `%2E` included. For a task of each character class
// and segment shape (made by a tick over HTTP), the fleet page's link must lead to the task's own
// page at the address the page wrote (unchanged by the browser), which must show that task, draw
// its timeline (history.svg), survive a reload, and pause and resume it with its buttons.
//
// Usage: node names.test.mjs (from scripts/page-test.sh).
import { join } from "node:path";
import assert from "node:assert/strict";
import { chromium } from "playwright-core";

import { CHROMIUM, OUT, Processes, runTest, until } from "./support.mjs";

/** The same list as crates/leasehold-serve/tests/names.rs. */
const NAMES = [
  "abcXYZ", "0123456789", "-", "_", ".", ":", "/", "a-b", "a_b", "a.b", "a:b", "a/b", "/lead",
  "trail/", "a//b", "//", "..", "...", ".hidden", "./x", "x/.", "x/..", "../../etc", "a/../b",
  "a/./b", "billing:expire-gigs/v2.1_x",
];

/** A name as one path segment, as the sidecar's clients write it (see page.js). */
const segment = (text) => (text === "." || text === ".." ? text.replace(/\./g, "%252E") : encodeURIComponent(text));
/** The task page's address the page should link to. */
const pagePath = (name) => `/tasks/${name.split("/").map((p) => segment(p).replace(/%3A/g, ":")).join("/")}`;

const procs = new Processes("leasehold-names-");
const store = `sqlite:${join(procs.dir, "names.db")}`;

async function main() {
  const { base } = await procs.serve(store);
  for (const name of NAMES) {
    const api = `${base}/v1/tasks/${segment(name)}`;
    const tick = await (await fetch(`${api}/ticks`, { method: "POST", body: JSON.stringify({ every_ms: 3_600_000 }) })).json();
    assert.equal(tick.task, name, JSON.stringify(tick));
    const done = await fetch(`${api}/ticks/${tick.slot}/done`, { method: "POST", body: JSON.stringify({ token: tick.token, outcome: "ok" }) });
    assert.equal(done.status, 200, `${name}: ${await done.text()}`);
  }
  await until("the catalog has every task", async () =>
    (await (await fetch(`${base}/v1/tasks`)).json()).tasks.length === NAMES.length, 10000);

  const browser = await chromium.launch({ executablePath: CHROMIUM, args: ["--no-sandbox"] });
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
    const errors = [];
    page.on("pageerror", (e) => errors.push(e.message));
    for (const name of NAMES) {
      await page.goto(`${base}/`);
      const link = page.locator("#tasks").getByRole("link", { name, exact: true });
      await until(`the fleet lists ${name}`, () => link.isVisible(), 5000);
      // This sidecar asks for no token: the page offers none.
      assert.equal(await page.locator("#token-open").isVisible(), false, "no Token button without a token");
      await link.click();
      const path = pagePath(name);
      await page.waitForURL((url) => url.pathname === path, { timeout: 5000 })
        .catch(() => { throw new Error(`${name}: the link led to ${page.url()}, not ${path}`); });
      const shown = async () => {
        const heading = await page.locator("#task-h").textContent({ timeout: 100 }).catch(() => "");
        const timeline = page.locator(`svg[aria-label="Run history timeline of ${name}"]`);
        return heading.startsWith(`${name} `) && timeline.isVisible();
      };
      await until(`${name}: its page shows it and its timeline`, shown, 5000);
      await page.reload();
      await until(`${name}: its page shows it after a reload`, shown, 5000);
      // The buttons post to the task's API address.
      await page.getByRole("button", { name: `Pause ${name}`, exact: true }).click();
      await page.locator("#confirm").getByRole("button", { name: "Pause" }).click();
      await until(`${name}: paused`, () => page.locator("#result").filter({ hasText: `Paused ${name}.` }).isVisible(), 5000);
      const paused = await (await fetch(`${base}/v1/tasks/${segment(name)}`)).json();
      assert.equal(paused.paused?.by !== undefined, true, `${name} is paused in the store: ${JSON.stringify(paused.paused)}`);
      await page.getByRole("button", { name: `Resume ${name}`, exact: true }).click();
      await page.locator("#confirm").getByRole("button", { name: "Resume" }).click();
      await until(`${name}: resumed`, async () =>
        (await (await fetch(`${base}/v1/tasks/${segment(name)}`)).json()).paused === null, 5000);
      if (name === "../../etc") await page.screenshot({ path: join(OUT, "task-dot-segments-1280.png") });
      console.log(`  ${JSON.stringify(name)}: ${path}`);
    }
    assert.deepEqual(errors, [], "no script errors");
  } finally {
    await browser.close();
  }
}

await runTest("names test", procs, main);
