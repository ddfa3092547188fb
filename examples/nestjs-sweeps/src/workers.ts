import { Injectable } from "@nestjs/common";
import { Cron, Interval } from "@nestjs/schedule";
import { SingleActive, leaseholdRun } from "@leasehold/client/nestjs";

import { config } from "./config.js";
import { record } from "./ledger.js";

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

/** One sweep, in the run `@SingleActive` holds for it (its slot, fencing token and loss signal). */
async function sweep(worker: string): Promise<void> {
  const run = leaseholdRun();
  if (run === undefined) throw new Error(`${worker}: not in a leasehold run`);
  const start = Date.now();
  // A timer slot whose run was cut off (its replica SIGKILLed) runs again as `retry`, attempt 2.
  const [trigger, attempt] = run.gated ? [run.trigger, run.attempt] : ["ungated", 1];
  const entry = { worker, slot: run.slot, token: run.token, trigger, attempt, start };
  record({ ...entry, phase: "start" });
  await work(run.signal);
  record({ ...entry, phase: "end", end: Date.now() });
}

/**
 * The repin sweep's slots: a cron expression in a time zone when REPIN_CRON is set (a nightly
 * re-pin at 03:00 local), else the interval.
 */
const repinSchedule =
  config.repinCron === undefined
    ? Interval(config.intervalMs)
    : Cron(config.repinCron, { timeZone: config.repinTimeZone });

/**
 * The service's sweeps on @nestjs/schedule timers, as it had them, with one change:
 * `@SingleActive` asks the sidecar first, so with N replicas each sweep still runs once per
 * slot, on one of them.
 */
@Injectable()
export class Sweeps {
  /** Expires gigs past their deadline and sends the webhooks: must not run twice per interval. */
  @Interval(config.intervalMs)
  @SingleActive({ task: "gig-expiry" })
  expireGigs(): Promise<void> {
    return sweep("gig-expiry");
  }

  /** Re-pins content whose pins lapsed. */
  @repinSchedule
  @SingleActive({ task: "repin" })
  repin(): Promise<void> {
    return sweep("repin");
  }
}
