// Settings from the environment, so the same build runs as any replica.
const num = (name: string, fallback: number) => {
  const raw = process.env[name];
  const value = raw === undefined ? fallback : Number(raw);
  if (!Number.isFinite(value) || value <= 0) throw new Error(`${name} must be a positive number, not ${raw}`);
  return value;
};

export const config = {
  /** This replica's name, in the ledger. */
  replica: process.env.REPLICA ?? `replica-${process.pid}`,
  /** Where each completed sweep appends a JSON line (the e2e test reads it). */
  ledger: process.env.LEDGER ?? "sweeps.ledger",
  /** The sweeps' interval: the app's own timer, and the slots the sidecar gates. */
  intervalMs: num("SWEEP_INTERVAL_MS", 30_000),
  /**
   * The repin sweep's slots as a cron expression instead of the interval, e.g. "0 3 * * *" (the
   * timer still ticks every SWEEP_INTERVAL_MS; each tick belongs to the latest cron time, run once).
   */
  repinCron: process.env.REPIN_CRON,
  /** The IANA time zone of REPIN_CRON's times, e.g. Europe/Berlin (default UTC). */
  repinTimeZone: process.env.REPIN_TIME_ZONE,
  /** How long one sweep works (a stand-in for the real queries and webhooks). */
  workMs: num("WORK_MS", 100),
  /** The task lease's ttl while a sweep runs: how long a crashed replica's run blocks the task. */
  ttlMs: num("LEASE_TTL_MS", 15_000),
  /** Log every tick's outcome (ran, already-run, store-down, ...), not only failures. */
  logTicks: process.env.LOG_TICKS === "1",
  /** When the sidecar itself is unreachable: skip the sweep (default) or run it ungated. */
  onSidecarDown: (process.env.ON_SIDECAR_DOWN ?? "fail-closed") as "fail-closed" | "fail-open",
};
