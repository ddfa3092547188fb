// The README's example, runnable: start a sidecar, then run this file.
//   leasehold serve --store sqlite:/tmp/leasehold-example.db &
//   npm ci && npm run build && node example.mjs
import { LeaseholdClient } from "@leasehold/client";

const leasehold = new LeaseholdClient({ baseUrl: process.env.LEASEHOLD_SIDECAR ?? "http://127.0.0.1:7070" });
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// A lease held while you work: its signal aborts the moment it is lost.
const lease = await leasehold.acquire("reindex", { ttlMs: 5_000, waitMs: 2_000 });
if (lease) {
  try {
    console.log(`reindex: held with token ${lease.token}, valid for ${Math.round(lease.validForMs)} ms`);
    await sleep(300); // the work; pass lease.signal to what you call, lease.token with each write
    if (lease.signal.aborted) throw lease.signal.reason;
  } finally {
    await lease.release();
  }
} else {
  console.log("reindex: busy elsewhere");
}

// Your own timer, as before: the sweep runs on one instance per 1 s slot, whichever sidecar asks.
for (let i = 0; i < 3; i++) {
  const result = await leasehold.gate("expire-gigs", { everyMs: 1_000, ttlMs: 5_000 }, async (run) => {
    console.log(`expire-gigs: running slot ${run.slot} with token ${run.token}`);
    await sleep(100); // the sweep; stop if run.signal aborts
  });
  console.log(`expire-gigs: ${result}`); // ran, failed, already-run, busy, not-leader, store-down, sidecar-down
  await sleep(1_000);
}
