// DNS rebinding in a real browser (issue 36 item 3): chromium resolves evil.example (and
// sidecar.test) to 127.0.0.1 (--host-resolver-rules), as an attacker's DNS does once the
// attacker's page is loaded. The attacker's page (served by the test, before the "rebinding")
// then asks its own origin, now the sidecar without a token, for the fleet and posts a tick and
// a pause: every request must be refused (403) and nothing in the store changed. Opening
// http://evil.example:PORT/ itself shows the 403 page, while http://127.0.0.1:PORT/ and
// http://localhost:PORT/ show the fleet, and a sidecar started with --allow-host sidecar.test
// answers at http://sidecar.test:PORT/.
//
// Chromium's own Local Network Access checks would block some of these requests before they
// left the browser; they are turned off, because the sidecar must not rely on them (other
// browsers, older versions, and pages that got a permission do not have them).
//
// Usage: node rebinding.test.mjs (from scripts/page-test.sh).
import { join } from "node:path";
import assert from "node:assert/strict";
import { chromium } from "playwright-core";

import { CHROMIUM, OUT, Processes, runTest, until } from "./support.mjs";

const TASK = "rebinding-victim";
const procs = new Processes("leasehold-rebinding-");
const store = `sqlite:${join(procs.dir, "fleet.db")}`;

/** The attacker's page: it reads and posts to its own origin, and keeps what it got. */
const ATTACK = `<!doctype html><title>attacker</title><script>
window.results = (async () => {
  const ask = async (method, path, body) => {
    try {
      const r = await fetch(path, { method, body, headers: body ? { "Content-Type": "application/json" } : {} });
      return { method, path, status: r.status, text: await r.text() };
    } catch (e) {
      return { method, path, status: 0, text: String(e) };
    }
  };
  return [
    await ask("GET", "/v1/tasks"),
    await ask("GET", "/v1/tasks/${TASK}"),
    await ask("GET", "/v1/leases"),
    await ask("GET", "/v1/tasks/${TASK}/history.svg"),
    await ask("GET", "/metrics"),
    await ask("GET", "/healthz"),
    await ask("POST", "/v1/tasks/attacker-task/ticks", JSON.stringify({ every_ms: 60000 })),
    await ask("POST", "/v1/tasks/${TASK}/pause", JSON.stringify({ reason: "pwned" })),
    await ask("POST", "/v1/leases/attacker-lease/acquire", JSON.stringify({ ttl_ms: 60000 })),
  ];
})();
</script>`;

async function fleet(base) {
  return (await (await fetch(`${base}/v1/tasks`)).json()).tasks;
}

async function main() {
  const open = await procs.serve(store);
  const allowing = await procs.serve(store, ["--allow-host", "sidecar.test"]);
  // A task in the fleet, through the loopback address.
  const tick = await fetch(`${open.base}/v1/tasks/${TASK}/ticks`, { method: "POST", body: JSON.stringify({ every_ms: 60000 }) });
  assert.equal(tick.status, 200, await tick.text());
  await until("the task is in the catalog", async () => (await fleet(open.base)).some((t) => t.name === TASK), 5000);

  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: [
      "--no-sandbox",
      "--host-resolver-rules=MAP evil.example 127.0.0.1, MAP sidecar.test 127.0.0.1",
      "--disable-features=LocalNetworkAccessChecks,PrivateNetworkAccessRespectPreflightResults,BlockInsecurePrivateNetworkRequests",
    ],
  });
  try {
    const page = await browser.newPage();
    const evil = `http://evil.example:${open.port}`;
    // The attacker's own page, as its server sent it before the name was rebound.
    await page.route(`${evil}/attack`, (route) => route.fulfill({ contentType: "text/html", body: ATTACK }));
    await page.goto(`${evil}/attack`);
    const results = await page.evaluate(() => window.results);
    for (const r of results) {
      console.log(`  ${r.method} ${evil}${r.path}: ${r.status}`);
      assert.equal(r.status, 403, `${r.method} ${r.path} from the rebound page: ${r.status} ${r.text.slice(0, 300)}`);
      assert.ok(!r.text.includes(TASK), `${r.path} gave nothing of the fleet away: ${r.text.slice(0, 300)}`);
    }
    // Nothing changed: no task, no pause, no lease.
    const tasks = await fleet(open.base);
    assert.deepEqual(tasks.map((t) => t.name), [TASK], "the refused tick registered nothing");
    assert.equal(tasks[0].paused, null, "the refused pause paused nothing");
    const leases = (await (await fetch(`${open.base}/v1/leases`)).json()).leases;
    assert.ok(!leases.some((l) => l.name === "attacker-lease"), JSON.stringify(leases));

    // The sidecar's own page under the foreign name: the 403 page, whatever the path.
    for (const path of ["/", `/tasks/${TASK}`, "/metrics", "/healthz"]) {
      const response = await page.goto(`${evil}${path}`);
      assert.equal(response.status(), 403, path);
    }
    await until("the 403 page says why", () => page.getByRole("heading", { name: "Not under this name (403)" }).isVisible(), 2000);
    await page.screenshot({ path: join(OUT, "wrong-host.png") });

    // Under loopback names, and under a name given with --allow-host, the page shows the fleet.
    for (const base of [open.base, `http://localhost:${open.port}`, `http://sidecar.test:${allowing.port}`]) {
      const response = await page.goto(`${base}/`);
      assert.equal(response.status(), 200, base);
      const link = page.getByRole("link", { name: TASK, exact: true });
      await until(`${base}/ lists the task`, () => link.isVisible(), 5000);
      await link.click();
      await page.waitForURL(`**/tasks/${TASK}`);
      await until(`${base}: the task's page shows its runs`, () => page.getByRole("heading", { name: "Runs, newest first" }).isVisible(), 5000);
      console.log(`  ${base}/: the fleet and the task's page`);
    }
    const refused = await page.goto(`http://evil.example:${allowing.port}/`);
    assert.equal(refused.status(), 403, "--allow-host allows only the name it gives");
  } finally {
    await browser.close();
  }
}

await runTest("rebinding test", procs, main);
