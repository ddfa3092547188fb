// node-cron 4's run coordinator over the leasehold sidecar: each fire of a `distributed` task
// runs on one replica per slot, across every replica and sidecar on the store.
//
//   import cron from "node-cron";
//   import { LeaseholdClient } from "@leasehold/client";
//   import { leaseholdCoordinator } from "@leasehold/client/node-cron";
//   cron.setRunCoordinator(leaseholdCoordinator(new LeaseholdClient()));
//   cron.schedule("*/5 * * * * *", job, { name: "expire-gigs", distributed: true });
//
// node-cron asks `shouldRun("NAME:ISO-FIRE-TIME", ttlMs)` before each fire and calls
// `onComplete` after it. The coordinator ticks the task NAME with the task's own cron pattern
// and time zone (read from node-cron's task list, or given), so the sidecar names the slot, and
// a fire a little early on a clock ahead of the store's waits for its slot (see `tick`). The
// run holds the task lease (kept alive by the client) until `onComplete` ends it, so a replica
// killed mid-run blocks the task for at most the ttl (node-cron's `distributedLease`).

import { LeaseholdClient, LeaseholdError, type Run, type Schedule, type TickOptions, type UngatedRun } from "./index.js";

/** node-cron 4's `RunCoordinator`, structurally (this package does not depend on node-cron). */
export interface RunCoordinator {
  shouldRun(key: string, ttlMs: number): Promise<boolean>;
  onComplete(key: string): Promise<void>;
}

/** The part of a node-cron task the coordinator reads (`cron.getTasks()`'s values). */
export interface CronTaskLike {
  name?: string;
  getPattern(): string;
  /** Set by node-cron from the task's `timezone` option. */
  timezone?: string;
}

export interface CoordinatorOptions {
  /**
   * The tasks to find each fire's pattern and time zone in, by name. Default: node-cron's own
   * (`getTasks()` of the `node-cron` the application imports).
   */
  tasks?: () => Iterable<CronTaskLike> | Map<string, CronTaskLike>;
  /** Schedules by task name, instead of the task's pattern (e.g. for a task given a function pattern). */
  schedules?: Record<string, Schedule>;
  /** The run's keepalive (default: its ttl). */
  keepaliveMs?: number;
  /** How late a slot found unrun may still run (default: the sidecar's, an hour for cron). */
  catchUpWindowMs?: number;
  /** What a tick does while the store is down (default: the sidecar's). */
  onStoreDown?: TickOptions["onStoreDown"];
  /** Told of each fire that did not run here and why (`already-run`, `busy`, ...), e.g. to log it. */
  onSkip?: (task: string, reason: string) => void;
}

/** A coordinator, with the runs it holds. */
export interface LeaseholdCoordinator extends RunCoordinator {
  /** The run this replica holds for `task` now (inside the job), with its token and signal. */
  current(task: string): Run | UngatedRun | undefined;
}

/** An ISO time as `Date.toISOString` writes it, at the end of node-cron's key. */
const ISO_TAIL = /:(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z)$/;
const MIN_TTL_MS = 1_000;
const MAX_TTL_MS = 86_400_000;

let nodeCronTasks: (() => Map<string, CronTaskLike>) | undefined;

async function importedTasks(): Promise<Iterable<CronTaskLike>> {
  if (nodeCronTasks === undefined) {
    // The application's node-cron, found from here (a dependency beside this package).
    const name = "node-cron";
    const mod = (await import(name)) as { getTasks?: () => Map<string, CronTaskLike>; default?: { getTasks?: () => Map<string, CronTaskLike> } };
    const getTasks = mod.getTasks ?? mod.default?.getTasks;
    if (getTasks === undefined) throw new Error("node-cron has no getTasks(): node-cron 4.6 or later is needed");
    nodeCronTasks = getTasks;
  }
  return nodeCronTasks().values();
}

/**
 * A node-cron 4 `RunCoordinator` that gates each fire through the sidecar: give it to
 * `cron.setRunCoordinator(...)` (or a task's `runCoordinator` option) and schedule tasks with a
 * `name` (the leasehold task: `leasehold status`, `history`, `pause`, `trigger`) and
 * `distributed: true`. A fire that this replica does not run is skipped (`execution:skipped`,
 * reason `not-elected`); a sidecar that cannot be reached skips it too (`coordinator-error`),
 * unless the client is `onSidecarDown: "fail-open"`.
 */
export function leaseholdCoordinator(client: LeaseholdClient, options: CoordinatorOptions = {}): LeaseholdCoordinator {
  const runs = new Map<string, Run | UngatedRun>();
  const byTask = new Map<string, Run | UngatedRun>();

  async function schedule(task: string): Promise<Schedule> {
    const given = options.schedules?.[task];
    if (given !== undefined) return given;
    const tasks = options.tasks ? options.tasks() : await importedTasks();
    const all = tasks instanceof Map ? tasks.values() : tasks;
    for (const t of all) {
      if (t.name === task) {
        const pattern = t.getPattern();
        return t.timezone ? { cron: pattern, timeZone: t.timezone } : { cron: pattern };
      }
    }
    throw new Error(`node-cron task ${task} not found: schedule it with { name: "${task}", distributed: true }, or give its schedule in schedules`);
  }

  return {
    async shouldRun(key: string, ttlMs: number): Promise<boolean> {
      const m = ISO_TAIL.exec(key);
      if (m === null) throw new Error(`not a node-cron fire key: ${key}`);
      const task = key.slice(0, m.index);
      const ttl = Math.min(MAX_TTL_MS, Math.max(MIN_TTL_MS, Math.round(ttlMs)));
      const tick: TickOptions = { ...(await schedule(task)), ttlMs: ttl };
      if (options.keepaliveMs !== undefined) tick.keepaliveMs = options.keepaliveMs;
      if (options.catchUpWindowMs !== undefined) tick.catchUpWindowMs = options.catchUpWindowMs;
      if (options.onStoreDown !== undefined) tick.onStoreDown = options.onStoreDown;
      let answer;
      try {
        answer = await client.tick(task, tick);
      } catch (e) {
        if (e instanceof LeaseholdError && e.code === "sidecar-down" && client.onSidecarDown === "fail-open") {
          const run: UngatedRun = {
            run: true,
            gated: false,
            task,
            slot: Date.parse(m[1]),
            token: null,
            signal: new AbortController().signal,
            done: async () => false,
          };
          runs.set(key, run);
          byTask.set(task, run);
          return true;
        }
        throw e;
      }
      if (answer.run === false) {
        options.onSkip?.(task, answer.reason);
        return false;
      }
      runs.set(key, answer);
      byTask.set(task, answer);
      return true;
    },

    async onComplete(key: string): Promise<void> {
      const run = runs.get(key);
      if (run === undefined) return;
      runs.delete(key);
      const task = run.task;
      if (byTask.get(task) === run) byTask.delete(task);
      // node-cron does not say how the job ended: its failures are its logger's.
      await run.done("ok");
    },

    current(task: string): Run | UngatedRun | undefined {
      return byTask.get(task);
    },
  };
}
