import { Inject, Injectable } from "@nestjs/common";
import { LeaseholdClient, type Run, type Schedule, type UngatedRun } from "@leasehold/client";

import { config } from "./config.js";
import { record } from "./ledger.js";
import { SweepWorker } from "./sweep-worker.js";

/** Stands in for the real work: waits `workMs`, or stops when the run's lease is lost. */
function work(signal: AbortSignal): Promise<void> {
  return new Promise((ok, fail) => {
    const done = setTimeout(ok, config.workMs);
    signal.addEventListener("abort", () => {
      clearTimeout(done);
      fail(signal.reason);
    });
  });
}

async function sweep(worker: string, run: Run | UngatedRun): Promise<void> {
  const start = Date.now();
  const entry = { worker, slot: run.slot, token: run.token, start };
  record({ ...entry, phase: "start" });
  await work(run.signal);
  record({ ...entry, phase: "end", end: Date.now() });
}

/** Expires gigs past their deadline and sends the webhooks: must not run twice per interval. */
@Injectable()
export class GigExpiryWorkerService extends SweepWorker {
  protected readonly task = "gig-expiry";
  constructor(@Inject(LeaseholdClient) leasehold: LeaseholdClient) {
    super(leasehold);
  }
  protected runOnce(run: Run | UngatedRun): Promise<void> {
    return sweep("gig-expiry", run);
  }
}

/** Re-pins content whose pins lapsed. */
@Injectable()
export class RepinWorkerService extends SweepWorker {
  protected readonly task = "repin";
  constructor(@Inject(LeaseholdClient) leasehold: LeaseholdClient) {
    super(leasehold);
  }
  protected runOnce(run: Run | UngatedRun): Promise<void> {
    return sweep("repin", run);
  }
  /** A cron expression in a time zone when REPIN_CRON is set (a nightly re-pin at 03:00 local). */
  protected schedule(): Schedule {
    if (config.repinCron === undefined) return super.schedule();
    return { cron: config.repinCron, timeZone: config.repinTimeZone };
  }
}
