// The sidecar's live page in a real browser (Debian's chromium driven by playwright-core):
// `leasehold serve` with a token and two `leasehold run --every 1s` instances on one SQLite file.
// The page must list the task within 2 s, show a new leader within ttl + 2 s after SIGKILL of the
// old one, pause (runs stop on every instance, seen in the history), resume (runs go on) and
// trigger (exactly one manual run), all without a reload; say 401 until it has the token; answer
// unknown task pages with a 404 page. Screenshots of each state go to $PAGE_TEST_OUT.
//
// Usage: node page.test.mjs (from scripts/page-test.sh, which sets LEASEHOLD_BIN, CHROMIUM and
// PAGE_TEST_OUT).
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import assert from "node:assert/strict";
import { chromium } from "playwright-core";

import { CHROMIUM, OUT, Processes, runTest, sleep, until } from "./support.mjs";

const TOKEN = "page-browser-test-token-0123456789";
const TASK = "pagetest";
const TTL_MS = 3000;
/** Live updates must show within this long (the page polls every second). */
const LIVE_MS = 2000;

const procs = new Processes("leasehold-page-");
const dir = procs.dir;
const store = `sqlite:${join(dir, "page.db")}`;
const start = (args, name) => procs.start(args, name);

let base;
async function api(path, init = {}) {
  const response = await fetch(`${base}${path}`, {
    ...init,
    headers: { Authorization: `Bearer ${TOKEN}`, ...(init.headers || {}) },
  });
  const text = await response.text();
  if (!response.ok) throw new Error(`${path}: ${response.status} ${text}`);
  return JSON.parse(text);
}

const taskPath = `/v1/tasks/${TASK}`;
const history = async () => (await api(`${taskPath}?limit=200`)).history;

/** Milliseconds from now until `check` holds on the page, failing past `limitMs`. */
async function timed(what, check, limitMs) {
  const t0 = Date.now();
  await until(what, check, limitMs);
  const took = Date.now() - t0;
  console.log(`  ${what}: ${took} ms`);
  return took;
}

async function giveToken(page) {
  assert.ok(await page.locator("#token-open").isVisible(), "the Token button is offered once a 401 was met");
  await page.getByLabel("Bearer token").fill(TOKEN);
  await page.getByRole("button", { name: "Use token" }).click();
  await until("the fleet is shown", () => page.getByRole("heading", { name: "Tasks" }).isVisible(), 5000);
  assert.equal(await page.locator("#auth").isVisible(), false, "the token form closes once the token works");
}

/** Pause with no or a wrong token: the result and the token form say 401. */
async function pauseWith401(page, row) {
  await row.getByRole("button", { name: `Pause ${TASK}` }).click();
  await page.locator("#confirm").getByRole("button", { name: "Pause" }).click();
  await until("the button's 401 is shown", () => page.locator("#result").filter({ hasText: "401 Unauthorized" }).isVisible(), LIVE_MS);
  await until("the token is asked for", () => page.locator("#auth-why").filter({ hasText: "401 Unauthorized" }).isVisible(), LIVE_MS);
  assert.equal((await api(taskPath)).paused, null, "nothing was paused");
}

async function main() {
  const tokenFile = join(dir, "token");
  writeFileSync(tokenFile, `${TOKEN}\n`);
  ({ base } = await procs.serve(store, ["--auth-token-file", tokenFile]));

  const browser = await chromium.launch({ executablePath: CHROMIUM, args: ["--no-sandbox"] });
  try {
    const context = await browser.newContext({ viewport: { width: 1280, height: 800 } });
    const page = await context.newPage();
    const errors = [];
    page.on("pageerror", (e) => errors.push(e.message));
    // Anything the page's Content-Security-Policy refused (the 401s it is shown are expected).
    page.on("console", (m) => { if (/Refused|Content Security Policy/.test(m.text())) errors.push(m.text()); });

    // Whether reading needs the token too (buttons always do, where one is set).
    const readsOpen = (await fetch(`${base}/v1/tasks`)).status !== 401;
    console.log(`without the token (reading ${readsOpen ? "open" : "needs it too"})`);
    await page.goto(`${base}/`);
    await page.evaluate(() => { window.notReloaded = true; });
    if (!readsOpen) {
      await until("the 401 is shown", () => page.locator("#auth-why").filter({ hasText: "401 Unauthorized" }).isVisible(), 5000);
      await page.screenshot({ path: join(OUT, "401.png") });
      await giveToken(page);
    }

    const row = page.getByRole("row").filter({ has: page.getByRole("link", { name: TASK, exact: true }) });
    // Two instances of one scheduled job.
    console.log("two `leasehold run` instances");
    const run = () => start(["run", "--store", store, "--lease", TASK, "--every", "1s", "--ttl", `${TTL_MS / 1000}s`,
      "--", "sh", "-c", "sleep 0.2"], "run");
    const instances = [run(), run()];
    await until("the catalog lists the task", async () =>
      (await api("/v1/tasks")).tasks.some((t) => t.name.startsWith(TASK)), 20000);
    await timed("the page lists the task", () => row.isVisible(), LIVE_MS);
    await until("both instances are live", async () =>
      (await api(taskPath)).instances.filter((i) => i.live).length === 2, 10000);
    await until("a run is recorded", async () => (await history()).some((r) => r.outcome === "ok"), 10000);
    // (The newest run may be going at every poll: runs take a fifth of each second.)
    await until("the page shows a last run", () => row.locator(".outcome-ok, .outcome-running").first().isVisible(), LIVE_MS);
    if (readsOpen) {
      // A button without the token: 401, and the page asks for it.
      await pauseWith401(page, row);
      await page.screenshot({ path: join(OUT, "401.png") });
      await giveToken(page);
    }
    await page.screenshot({ path: join(OUT, "fleet-1280.png"), fullPage: true });

    // Pause: runs stop on every instance.
    console.log("pause");
    await row.getByRole("button", { name: `Pause ${TASK}` }).click();
    // From the keyboard: the reason, and Enter confirms.
    await page.getByLabel("Reason (optional, shown to others)").fill("browser test");
    await page.getByLabel("Your name (optional, recorded as who asked)").fill("page-tester");
    await page.keyboard.press("Enter");
    await timed("the page shows paused", () => row.getByText("paused", { exact: true }).first().isVisible(), LIVE_MS);
    await until("the result is shown", () => page.locator("#result").filter({ hasText: `Paused ${TASK}.` }).isVisible(), LIVE_MS);
    await page.screenshot({ path: join(OUT, "paused-1280.png"), fullPage: true });
    const paused = (await api(taskPath)).paused;
    assert.ok(paused, "the store has the pause");
    assert.equal(paused.by, "page-tester", "the pause names who asked, as typed");
    // A run granted just before the pause may still start; none after a second more.
    await sleep(4000);
    const during = (await history()).filter((r) => r.started_ms > paused.at_ms + 1500 && !r.paused && r.outcome !== "missed");
    assert.deepEqual(during, [], "no run started while paused");
    assert.ok((await history()).some((r) => r.paused), "paused slots are recorded");

    // Resume: runs go on.
    console.log("resume");
    await row.getByRole("button", { name: `Resume ${TASK}` }).click();
    await page.locator("#confirm").getByRole("button", { name: "Resume" }).click();
    await timed("the page shows it resumed", async () => !(await row.getByText("paused", { exact: true }).first().isVisible()), LIVE_MS);
    const resumedAt = Date.now();
    await until("runs go on after resume", async () =>
      (await history()).some((r) => r.outcome === "ok" && r.started_ms > resumedAt - 500), 5000);

    // Trigger: exactly one manual run.
    console.log("trigger");
    await row.getByRole("button", { name: `Trigger ${TASK}` }).click();
    await page.locator("#confirm").getByRole("button", { name: "Trigger" }).click();
    const said = await until("the trigger's id is shown", async () => {
      const text = await page.locator("#result").textContent();
      return /requested \(id ([^)]+)\)/.exec(text || "");
    }, LIVE_MS);
    const id = said[1];
    await until("the manual run is recorded", async () =>
      (await history()).some((r) => r.request && r.request.id === id && r.outcome === "ok"), 10000);
    await sleep(2500);
    const manual = (await history()).filter((r) => r.request && r.request.id === id && r.outcome !== "missed");
    assert.equal(manual.length, 1, `one manual run for ${id}: ${JSON.stringify(manual)}`);

    // The task's page: the manual run in the list, the timeline with focusable tooltips.
    console.log("the task's page");
    await row.getByRole("link", { name: TASK, exact: true }).click();
    await page.waitForURL(`**/tasks/${TASK}`);
    await page.evaluate(() => { window.notReloaded = true; });
    const runs = page.locator("section").filter({ has: page.getByRole("heading", { name: "Runs, newest first" }) });
    await until("the manual run is listed", () => runs.getByText("manual").first().isVisible(), LIVE_MS);
    const mark = page.locator(".timeline [tabindex='0']").first();
    await until("the timeline is drawn", () => mark.isVisible(), 5000);
    await mark.focus();
    const tip = await until("focus shows the tooltip", async () =>
      (await page.locator("#tip").isVisible()) && page.locator("#tip").textContent(), 2000);
    assert.match(tip, /holder .* token \d+/, `the tooltip names holder and token: ${tip}`);
    await page.screenshot({ path: join(OUT, "task-1280.png"), fullPage: true });

    // SIGKILL of the leader: the other instance leads within ttl + 2 s, on the page.
    console.log("SIGKILL of the leader");
    const leases = await api("/v1/leases");
    const group = leases.leases.find((l) => l.name === TASK);
    assert.ok(group && group.holder, `the group ${TASK} has a leader: ${JSON.stringify(leases)}`);
    const leader = instances.find((c) => group.holder.includes(`:${c.pid}:`));
    assert.ok(leader, `the leader ${group.holder} is one of the instances`);
    const survivor = instances.find((c) => c !== leader);
    const facts = page.locator(".facts > div").filter({ has: page.locator("dt", { hasText: "Leader group" }) });
    await until("the page names the leader", () => facts.getByText(`:${leader.pid}`).first().isVisible(), LIVE_MS);
    leader.expectedExit = true;
    leader.kill("SIGKILL");
    await timed("the page shows the new leader", () => facts.getByText(`:${survivor.pid}`).first().isVisible(), TTL_MS + LIVE_MS);
    await page.screenshot({ path: join(OUT, "new-leader-1280.png"), fullPage: true });
    // The first screen of it, as the README shows (docs/page.png).
    await page.screenshot({ path: join(OUT, "task-view-1280.png") });
    assert.equal(await page.evaluate(() => window.notReloaded), true, "the page was never reloaded");

    // Phone width.
    await page.setViewportSize({ width: 375, height: 800 });
    await sleep(1200);
    await page.screenshot({ path: join(OUT, "task-375.png"), fullPage: true });
    await page.screenshot({ path: join(OUT, "task-view-375.png") });
    const taskOverflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    assert.ok(taskOverflow <= 0, `the task's page fits 375 px (${taskOverflow} px too wide)`);
    await page.goto(`${base}/`);
    await until("the fleet at phone width", () => row.isVisible(), 5000);
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    assert.ok(overflow <= 0, `the fleet fits 375 px (${overflow} px too wide)`);
    await page.screenshot({ path: join(OUT, "fleet-375.png"), fullPage: true });

    // An unknown task's page is a 404 page.
    console.log("unknown pages");
    const missing = await page.goto(`${base}/tasks/no-such-task`);
    assert.equal(missing.status(), 404);
    await until("the 404 page", () => page.getByRole("heading", { name: "Not found (404)" }).isVisible(), 2000);
    await page.screenshot({ path: join(OUT, "404-375.png") });

    // A wrong token: 401, said on the page (by the next read, or by the button).
    console.log("the wrong token");
    await page.goto(`${base}/`);
    await until("the fleet", () => row.isVisible(), 5000);
    await page.evaluate(() => sessionStorage.setItem("leasehold-token", "wrong-token-0123456789"));
    if (readsOpen) await pauseWith401(page, row);
    await until("the wrong token is refused", () => page.locator("#auth-why").filter({ hasText: "401 Unauthorized" }).isVisible(), LIVE_MS + 1000);
    await page.screenshot({ path: join(OUT, "401-wrong-token-375.png") });
    assert.deepEqual(errors, [], "no script errors");
    console.log(`screenshots in ${OUT}`);
  } finally {
    await browser.close();
  }
}

await runTest("page test", procs, main);
