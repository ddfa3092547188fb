import { BeforeApplicationShutdown, Logger, OnApplicationBootstrap } from "@nestjs/common";
import type { LeaseholdClient, Run, Schedule, UngatedRun } from "@leasehold/client";

import { config } from "./config.js";

/**
 * A sweep on a process-local timer, as the service had it, with one change: each tick asks the
 * sidecar first, so with N replicas the sweep still runs once per interval, on one of them.
 */
export abstract class SweepWorker implements OnApplicationBootstrap, BeforeApplicationShutdown {
  protected abstract readonly task: string;
  private timer?: ReturnType<typeof setInterval>;
  private running: Promise<unknown> = Promise.resolve();
  private busy = false;
  private readonly logger = new Logger(this.constructor.name);

  constructor(private readonly leasehold: LeaseholdClient) {}

  /** One sweep. `run.signal` aborts if this replica loses the run's lease: stop, do not write. */
  protected abstract runOnce(run: Run | UngatedRun): Promise<void>;

  /** The slots the sidecar gates: by default, every interval. */
  protected schedule(): Schedule {
    return { everyMs: config.intervalMs };
  }

  onApplicationBootstrap(): void {
    this.timer = setInterval(() => this.tick(), config.intervalMs);
    this.tick();
  }

  private tick(): void {
    // One tick at a time per worker: a tick that finds the last one still going is skipped (the
    // sidecar would answer busy anyway).
    if (this.busy) return;
    this.busy = true;
    this.running = this.leasehold
      .gate(this.task, { ...this.schedule(), ttlMs: config.ttlMs }, (run) => this.runOnce(run))
      .then((result) => {
        if (result === "failed" || result === "sidecar-down") this.logger.warn(`${this.task}: ${result}`);
        else if (config.logTicks) this.logger.warn(`${this.task}: ${result}`);
      })
      .catch((e: unknown) => this.logger.warn(`${this.task}: tick failed: ${String(e)}`))
      .finally(() => {
        this.busy = false;
      });
  }

  /** SIGTERM: no new ticks; the sweep in progress finishes and reports done, then the app exits. */
  async beforeApplicationShutdown(): Promise<void> {
    clearInterval(this.timer);
    await this.running;
  }
}
