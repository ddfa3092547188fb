import { BeforeApplicationShutdown, Logger, OnApplicationBootstrap } from "@nestjs/common";
import type { LeaseholdClient, Run, UngatedRun } from "@leasehold/client";

import { config } from "./config.js";

/**
 * A sweep on a process-local timer, as the service had it, with one change: each tick asks the
 * sidecar first, so with N replicas the sweep still runs once per interval, on one of them.
 */
export abstract class SweepWorker implements OnApplicationBootstrap, BeforeApplicationShutdown {
  protected abstract readonly task: string;
  private timer?: ReturnType<typeof setInterval>;
  private running: Promise<unknown> = Promise.resolve();
  private readonly logger = new Logger(this.constructor.name);

  constructor(private readonly leasehold: LeaseholdClient) {}

  /** One sweep. `run.signal` aborts if this replica loses the run's lease: stop, do not write. */
  protected abstract runOnce(run: Run | UngatedRun): Promise<void>;

  onApplicationBootstrap(): void {
    this.timer = setInterval(() => this.tick(), config.intervalMs);
    this.tick();
  }

  private tick(): void {
    // One tick at a time per worker; a tick that finds the last one still going is skipped.
    this.running = this.running.then(() =>
      this.leasehold
        .gate(this.task, { everyMs: config.intervalMs, ttlMs: config.ttlMs }, (run) => this.runOnce(run))
        .catch((e: unknown) => this.logger.warn(`tick failed: ${String(e)}`)),
    );
  }

  /** SIGTERM: no new ticks; the sweep in progress finishes and reports done, then the app exits. */
  async beforeApplicationShutdown(): Promise<void> {
    clearInterval(this.timer);
    await this.running;
  }
}
