// NestJS over the leasehold sidecar: `LeaseholdModule.forRoot({...})` provides the client, and
// `@SingleActive()` makes an `@Cron` or `@Interval` method (from @nestjs/schedule) run on one
// replica per slot, across every replica and sidecar on the store.
//
//   @Module({ imports: [ScheduleModule.forRoot(), LeaseholdModule.forRoot({ ttlMs: 15_000 })], providers: [Sweeps] })
//   class AppModule {}
//
//   @Injectable()
//   class Sweeps {
//     @Cron("*/5 * * * * *", { name: "expire-gigs" })
//     @SingleActive()
//     async expireGigs() { const run = leaseholdRun(); ... }   // run.token, run.signal
//   }
//
// The method's slots are the decorator's own: `@Cron`'s time and time zone (the cron the sidecar
// gates on), or `@Interval`'s milliseconds (slots at every multiple since the epoch). Nothing
// here needs Nest at run time: the module is a plain dynamic module, the decorator wraps the
// method and keeps its metadata, so the order of the two decorators does not matter.

import { AsyncLocalStorage } from "node:async_hooks";

import { LeaseholdClient, type ClientOptions, type GateResult, type Run, type Schedule, type TickOptions, type UngatedRun } from "./index.js";

/** What `@SingleActive` ticks with unless it says otherwise. */
export interface LeaseholdModuleOptions extends ClientOptions {
  /** The task lease's ttl while a method runs (default: the sidecar's, 30 s). */
  ttlMs?: number;
  /** How late a slot found unrun may still run (default: the sidecar's). */
  catchUpWindowMs?: number;
  /** What a tick does while the store is down (default: the sidecar's). */
  onStoreDown?: TickOptions["onStoreDown"];
  /** Told of every tick's outcome (`ran`, `already-run`, `failed`, ...), e.g. to log it. */
  onResult?: (task: string, result: GateResult) => void;
  /** An existing client, instead of one made from these options. */
  client?: LeaseholdClient;
}

export interface SingleActiveOptions {
  /** The leasehold task (`leasehold status`, `pause`, `trigger`). Default: the `@Cron` name, else `Class.method`. */
  task?: string;
  /** The slots, instead of the `@Cron` / `@Interval` ones. */
  schedule?: Schedule;
  ttlMs?: number;
  keepaliveMs?: number;
  catchUpWindowMs?: number;
  onStoreDown?: TickOptions["onStoreDown"];
}

let configured: { client: LeaseholdClient; options: LeaseholdModuleOptions } | undefined;
/** `@SingleActive` calls under way, which the application's shutdown waits for. */
const inFlight = new Set<Promise<void>>();
let stopping = false;
const current = new AsyncLocalStorage<Run | UngatedRun>();

/** The run a `@SingleActive` method is in (its slot, fencing token and loss signal); undefined outside one. */
export function leaseholdRun(): Run | UngatedRun | undefined {
  return current.getStore();
}

/**
 * The module: `imports: [LeaseholdModule.forRoot({...})]`; it provides `LeaseholdClient`
 * everywhere. On shutdown (`app.enableShutdownHooks()`, SIGTERM) it stops ticking and waits for
 * the runs in progress, so each finishes and records its outcome, and the next slot runs on
 * another replica.
 */
export class LeaseholdModule {
  /** Nest's hook, before the schedulers stop: no new ticks; the runs going end first. */
  async beforeApplicationShutdown(): Promise<void> {
    stopping = true;
    await Promise.allSettled([...inFlight]);
  }

  static forRoot(options: LeaseholdModuleOptions = {}): {
    module: typeof LeaseholdModule;
    global: boolean;
    providers: { provide: typeof LeaseholdClient; useValue: LeaseholdClient }[];
    exports: (typeof LeaseholdClient)[];
  } {
    const client = options.client ?? new LeaseholdClient(options);
    configured = { client, options };
    return {
      module: LeaseholdModule,
      global: true,
      providers: [{ provide: LeaseholdClient, useValue: client }],
      exports: [LeaseholdClient],
    };
  }
}

// @nestjs/schedule's metadata keys (schedule.constants).
const CRON_OPTIONS = "SCHEDULE_CRON_OPTIONS";
const INTERVAL_OPTIONS = "SCHEDULE_INTERVAL_OPTIONS";
const SCHEDULER_NAME = "SCHEDULER_NAME";

interface Metadata {
  getMetadata?(key: unknown, target: object): unknown;
  getMetadataKeys?(target: object): unknown[];
  defineMetadata?(key: unknown, value: unknown, target: object): void;
}
const meta = Reflect as unknown as Metadata;

function scheduleOf(fn: object): Schedule | undefined {
  const cron = meta.getMetadata?.(CRON_OPTIONS, fn) as { cronTime?: unknown; timeZone?: string } | undefined;
  if (cron !== undefined) {
    if (typeof cron.cronTime !== "string") return undefined;
    return cron.timeZone ? { cron: cron.cronTime, timeZone: cron.timeZone } : { cron: cron.cronTime };
  }
  const interval = meta.getMetadata?.(INTERVAL_OPTIONS, fn) as { timeout?: number } | undefined;
  if (interval?.timeout !== undefined) return { everyMs: interval.timeout };
  return undefined;
}

/**
 * Runs the decorated method only when this replica wins the slot, holding the task's lease
 * while it runs (`leaseholdRun()` inside it gives the run's token and abort signal); the run's
 * outcome (ok, or failed with the error) goes into the task's history. Put it on an `@Cron` or
 * `@Interval` method (either order), and import `LeaseholdModule.forRoot()` once.
 */
export function SingleActive(options: SingleActiveOptions = {}): MethodDecorator {
  return (target, key, descriptor) => {
    const original = descriptor.value as unknown as (...args: unknown[]) => unknown;
    if (typeof original !== "function") throw new TypeError("@SingleActive() goes on a method");
    const fallbackName = `${(target as { constructor: { name: string } }).constructor.name}.${String(key)}`;
    const wrapper = async function (this: unknown, ...args: unknown[]): Promise<void> {
      if (configured === undefined) throw new Error("@SingleActive(): import LeaseholdModule.forRoot() in the application module");
      const { client, options: defaults } = configured;
      const schedule = options.schedule ?? scheduleOf(wrapper) ?? scheduleOf(original);
      if (schedule === undefined) {
        throw new Error(`@SingleActive() on ${fallbackName}: no @Cron time (a cron string) or @Interval, and no schedule given`);
      }
      const name = options.task ?? (meta.getMetadata?.(SCHEDULER_NAME, wrapper) as string | undefined) ?? fallbackName;
      const tick: TickOptions = { ...schedule };
      const ttlMs = options.ttlMs ?? defaults.ttlMs;
      if (ttlMs !== undefined) tick.ttlMs = ttlMs;
      if (options.keepaliveMs !== undefined) tick.keepaliveMs = options.keepaliveMs;
      const window = options.catchUpWindowMs ?? defaults.catchUpWindowMs;
      if (window !== undefined) tick.catchUpWindowMs = window;
      const onStoreDown = options.onStoreDown ?? defaults.onStoreDown;
      if (onStoreDown !== undefined) tick.onStoreDown = onStoreDown;
      if (stopping) return;
      const going = client
        .gate(name, tick, (run) => current.run(run, async () => void (await original.apply(this, args))))
        .then((result) => defaults.onResult?.(name, result));
      inFlight.add(going);
      try {
        await going;
      } finally {
        inFlight.delete(going);
      }
    };
    for (const k of meta.getMetadataKeys?.(original) ?? []) {
      meta.defineMetadata?.(k, meta.getMetadata?.(k, original), wrapper);
    }
    Object.defineProperty(wrapper, "name", { value: original.name });
    descriptor.value = wrapper as unknown as typeof descriptor.value;
    return descriptor;
  };
}
