// Client for the leasehold sidecar (`leasehold serve`). No dependencies: Node's fetch,
// AbortController and timers.
//
// Every lease or run this client holds keeps itself alive with a loop of `watch` long-polls
// (each one is also the keepalive the sidecar requires), and carries an AbortSignal that aborts
// the moment the lease is lost: when the sidecar says so (410), or when the validity the sidecar
// last granted runs out locally without a renewal (sidecar unreachable, this process paused).
// The application must never act on a lease after `signal.aborted`.

import { hostname } from "node:os";

/** What to do when the sidecar itself cannot be reached. */
export type SidecarDownPolicy = "fail-closed" | "fail-open";

export interface ClientOptions {
  /** The sidecar, default `process.env.LEASEHOLD_SIDECAR` or `http://127.0.0.1:7070`. */
  baseUrl?: string;
  /** The bearer token, when the sidecar runs with `--auth-token-file`. */
  authToken?: string;
  /**
   * `gate` when the sidecar cannot be reached: `fail-closed` (default) does not run the job;
   * `fail-open` runs it ungated on this instance (every instance that cannot reach its sidecar
   * runs it).
   */
  onSidecarDown?: SidecarDownPolicy;
  /**
   * A request the sidecar has not answered after this many ms (on top of the wait it was asked
   * for, for acquire, watch and observe) fails as `sidecar-down`, like a refused connection, so a
   * hung or stopped sidecar does not hang the application's timer. Default 10000.
   */
  timeoutMs?: number;
  /**
   * This application instance, as the catalog (`leasehold status`, the page) lists it and as
   * run and lease holders start: 1 to 100 bytes, no whitespace or control characters. Default
   * `process.env.LEASEHOLD_INSTANCE`, else host name and pid (`web-3-4711`).
   */
  instance?: string;
}

/** `HOST-PID`, the host name cut so that the whole fits the sidecar's 100 bytes. */
export function defaultInstance(): string {
  const host = hostname().replace(/[^\x21-\x7e]/g, "_").slice(0, 80) || "host";
  return `${host}-${process.pid}`;
}

/** An error answer of the sidecar, or `sidecar-down` when it could not be reached. */
export class LeaseholdError extends Error {
  constructor(
    message: string,
    /** The HTTP status; 0 when the sidecar could not be reached. */
    readonly status: number,
    /** The API's error code (`bad-request`, `lost`, `store-down`, ...) or `sidecar-down`. */
    readonly code: string,
    /** The request field at fault, for `bad-request`. */
    readonly field?: string,
    /** Why a lease is not held, for `lost`. */
    readonly reason?: string,
  ) {
    super(message);
    this.name = "LeaseholdError";
  }

  /** The API's `error` field (same as `code`). */
  get error(): string {
    return this.code;
  }
}

export interface AcquireOptions {
  ttlMs: number;
  /** Wait this long for a busy lease (default 0: answer at once). */
  waitMs?: number;
  /** Call the sidecar at least this often or lose the lease (default: the ttl). */
  keepaliveMs?: number;
  /** A label for status, e.g. the pod name. */
  holder?: string;
}

/**
 * The task's slots: every `everyMs` since the Unix epoch, or the times of a cron expression (five
 * fields as in crontab, six with seconds first, or a macro such as `@daily`) in `timeZone`, an
 * IANA name (default UTC). A cron time skipped by a daylight-saving change runs once at the
 * change; a repeated one runs once, the first time.
 */
export type Schedule = { everyMs: number } | { cron: string; timeZone?: string };

export type TickOptions = Schedule & {
  /** Run only on the leader of this group. */
  group?: string;
  ttlMs?: number;
  keepaliveMs?: number;
  onStoreDown?: "fail-closed" | "fail-open" | "local";
  /**
   * How late a slot found unrun may still run (the task's first tick, a tick after an outage):
   * the newest such slot within the window runs, with `trigger: "catch-up"`. 0: none. Default:
   * the sidecar's (0 for `everyMs`, an hour for cron).
   */
  catchUpWindowMs?: number;
  /** Each attempt's time limit: the run's signal then aborts with reason `timed-out`. */
  timeoutMs?: number;
  /**
   * How many times a failed (`done("failed")`) or timed-out attempt is offered again: a later
   * tick whose slot already ran answers a `Run` of the same slot with `trigger: "retry"` and the
   * next `attempt`, after the backoff and never once the next slot has come. 0 to 100.
   */
  retries?: number;
  /** The wait before the first retry (default 1000), doubling up to `retryBackoffMaxMs`. */
  retryBackoffMs?: number;
  retryBackoffMaxMs?: number;
  /**
   * A slot falling while a run of the task is held: `skip` (answered `busy`, the default) or
   * `allow` (run beside it, under a run lease of its own).
   */
  overlap?: "skip" | "allow";
  /** Each slot's start put off by up to this much, the same on every instance. */
  jitterMs?: number;
  /**
   * A run cut off (its caller went silent, its sidecar died): run again once by a later tick as
   * `trigger: "retry"`, `attempt: 2` (`rerun`, the default), or left (`skip`).
   */
  onInterrupt?: "rerun" | "skip";
  /** How many run-history entries the store keeps for the task (1 to 1000; default 100). */
  history?: number;
};

export interface GroupState {
  group: string;
  leader: string | null;
  token: string | null;
  remaining_ms: number;
}

/** What `gate` did: ran the job (`ran`, or `failed` when it threw), or why it did not. */
export type GateResult = "ran" | "failed" | NotRun["reason"];

export interface NotRun {
  run: false;
  slot: number | null;
  reason: "not-leader" | "already-run" | "busy" | "store-down" | "not-due" | "paused" | "sidecar-down";
  /** With `not-due`: how long until the next slot (the store's clock). */
  startsInMs?: number;
}

/** Who paused a task, when (store clock, ms) and why. */
export interface Pause {
  by: string;
  reason?: string | null;
  at_ms: number;
}

/** A manual run asked for: its history record carries `id` (`request.id`). */
/** What `forget` answers. */
export interface Forgotten {
  task: string;
  history_removed: boolean;
}

export interface TriggerRequest {
  id: string;
  by: string;
  at_ms: number;
  /** No instance takes it after this (store clock, ms). */
  expires_ms: number;
  /** For a backfill (`backfill`): the range of slots it runs; absent for one manual run. */
  slots?: { from_ms: number; to_ms: number } | null;
}

/** What `backfill` answers. */
export interface BackfillAnswer {
  task: string;
  /** The request written (each backfill run's `request.id` is its `id`); null when every slot
   * of the range already ran ok and nothing was asked for. */
  request: TriggerRequest | null;
  /** Every slot of the task's schedule in the range, oldest first. */
  slots: number[];
  /** Those with no ok run in the history now, oldest first: the instance runs them. */
  to_run: number[];
}

/** A task's definition, as the instance that registered it last wrote it. */
export interface TaskDefinition {
  /** `scheduler`, `run`, `sidecar` (or `other`). */
  source: string;
  /** As written: `every 30s`, `cron "0 3 * * *"`. */
  schedule: string;
  time_zone: string | null;
  on_store_down: string;
  catch_up: string | null;
  gated: boolean;
  leader_group: string | null;
  spread_group: string | null;
  /** Each run's time limit, where the task has one. */
  timeout_ms?: number | null;
  /** How many times a failed or timed-out run is tried again, where it is. */
  retries?: number | null;
  /** At most how long each slot's start is put off, where it is. */
  jitter_ms?: number | null;
  /** `buffer-one`, `buffer-all`, `replace` or `allow`; null or absent: `skip`. */
  overlap?: string | null;
  /** The schedule as run records carry it, which `backfill` computes slots from. */
  slot_schedule?: { every_ms?: number; cron?: string } | null;
}

export interface TaskInstance {
  instance: string;
  live: boolean;
  /** Time left on its heartbeat. */
  remaining_ms: number;
  version: string | null;
  host: string | null;
  /** Null for an application instance a sidecar registered (`via`). */
  pid: number | null;
  /** For an application instance that ticks through a sidecar: that sidecar. */
  via?: string | null;
}

/** One history entry: a run, or slots that did not run (`outcome: "missed"`). */
export interface RunEntry {
  slot_ms: number | null;
  /** `timer`, `catch-up`, `manual`, `backfill`; null for missed slots. */
  trigger: string | null;
  holder: string;
  token: string | null;
  started_ms: number | null;
  ended_ms: number | null;
  duration_ms: number | null;
  /** `ok`, `failed`, `timed-out`, `cancelled`, `interrupted` for runs that ended, `running`,
   * `missed`. */
  outcome: string;
  /** A failed run's error, or why a cancelled run was told to stop. */
  error: string | null;
  /** For slots that fell while paused. */
  paused: Pause | null;
  /** For a manual run asked for by `trigger`. */
  request: { id: string; by: string } | null;
  /** For slots that did not run: how many from `slot_ms` to `last_slot_ms`, and why. */
  missed: { count: number; last_slot_ms: number; reason: string } | null;
  /** What the run printed, as its job kept it (`done`'s `output`): untrusted text. */
  output: string | null;
}

export interface Miss {
  slot_ms: number;
  count: number;
  last_slot_ms: number;
  /** `paused`, `not-claimed`, `store-down`, `overlap`, `outside-catch-up-window`. */
  reason: string;
}

/** A task in the store's catalog. */
export interface TaskSummary {
  name: string;
  /** `running` while its lease is held, else `paused`, else `no_instance`, else `failing`
   * (its last runs failed), else `idle`. */
  state: "running" | "paused" | "no_instance" | "failing" | "idle";
  /** Null until an instance registered it. */
  definition: TaskDefinition | null;
  paused: Pause | null;
  /** A trigger not taken yet. */
  trigger: TriggerRequest | null;
  /** Live ones first. */
  instances: TaskInstance[];
  /** The task lease, while a run holds it. */
  lease: { holder: string; token: string; remaining_ms: number } | null;
  last_run: RunEntry | null;
  /** Null while no instance runs it. */
  next_slot_ms: number | null;
  /** Slots that did not run in the last 24 hours, paused ones included. */
  missed_24h: number;
  /** The newest runs that failed or timed out in a row; 0 after a success. */
  consecutive_failures: number;
  /** When the newest `ok` run ended. */
  last_success_ms: number | null;
}

export interface TaskDetail extends TaskSummary {
  now_ms: number;
  /** Newest first. */
  history: RunEntry[];
  /** The last 24 hours, newest first. */
  missed: Miss[];
}

export interface LeaseEntry {
  name: string;
  holder: string | null;
  token: string | null;
  remaining_ms: number | null;
}

type Json = Record<string, unknown>;

/** A lease held through the sidecar. */
export class Lease {
  protected readonly client: LeaseholdClient;
  readonly #controller = new AbortController();
  #validUntil: number;
  #expiry: ReturnType<typeof setTimeout> | undefined;
  #ended = false;
  #freed = false;
  readonly #keepaliveMs: number;

  constructor(
    client: LeaseholdClient,
    /** The lease (or group, or task) name. */
    readonly name: string,
    /** The fencing token: send it with every write the lease protects. A string: tokens are 64-bit and can exceed 2^53. */
    readonly token: string,
    /** This grant's holder id. */
    readonly holder: string,
    sentAt: number,
    validForMs: number,
    keepaliveMs: number,
  ) {
    this.client = client;
    this.#keepaliveMs = keepaliveMs;
    // The sidecar counts valid_for_ms from when the request reached it, which is after it was
    // sent: counting from the send is on the safe side.
    this.#validUntil = sentAt + validForMs;
    this.#armExpiry();
    void this.#keepLoop();
  }

  /**
   * Aborts the moment the lease is lost, released or (for a run) done. `signal.reason` is a
   * `LeaseholdError` whose `reason` says why: `released`, `taken-over`, `expired` (no renewal
   * confirmed in time: the sidecar or this process was unresponsive), `app-silent`,
   * `timed-out` (a run past its `timeoutMs`), `unknown`, `done`.
   */
  get signal(): AbortSignal {
    return this.#controller.signal;
  }

  /** Milliseconds this holder may still act, by the local clock; 0 once the lease is lost. */
  get validForMs(): number {
    if (this.#ended) return 0;
    return Math.max(0, this.#validUntil - performance.now());
  }

  /**
   * Stops keeping the lease and frees it so another instance takes over at once. Resolves to
   * false when it was no longer held. Throws `sidecar-down` when the sidecar cannot be reached
   * (the lease then ends by itself within its keepalive).
   */
  async release(): Promise<boolean> {
    if (this.#freed) return false;
    this.#freed = true;
    this.#end("released");
    const answer = await this.client.post(`/v1/leases/${enc(this.name)}/release`, {
      token: this.token,
    });
    return answer.released === true;
  }

  /** Ends the keepalive loop locally; returns false if it had been ended already (by a loss). */
  protected end(reason: string): boolean {
    this.#freed = true;
    return this.#end(reason);
  }

  #end(reason: string): boolean {
    if (this.#ended) return false;
    this.#ended = true;
    clearTimeout(this.#expiry);
    this.#controller.abort(new LeaseholdError(`lease ${this.name}: ${reason}`, 410, "lost", undefined, reason));
    return true;
  }

  #armExpiry(): void {
    clearTimeout(this.#expiry);
    const left = this.#validUntil - performance.now();
    this.#expiry = setTimeout(() => this.#end("expired"), Math.max(0, left));
  }

  async #keepLoop(): Promise<void> {
    // The sidecar answers each watch within keepalive/4: the next call then reaches it long
    // before the validity granted by the previous answer runs out.
    const waitMs = Math.max(25, Math.floor(this.#keepaliveMs / 4));
    while (!this.#ended) {
      const sentAt = performance.now();
      try {
        const held = await this.client.post(
          `/v1/leases/${enc(this.name)}/watch`,
          { token: this.token, wait_ms: waitMs },
          { waitMs, signal: this.signal },
        );
        if (this.#ended) return;
        this.#validUntil = sentAt + Number(held.valid_for_ms);
        this.#armExpiry();
      } catch (e) {
        if (this.#ended) return;
        if (e instanceof LeaseholdError && e.status === 410) {
          this.#end(e.reason ?? "lost");
          return;
        }
        // The sidecar is unreachable or slow: the validity timer decides; retry shortly.
        await sleep(Math.min(200, waitMs));
      }
    }
  }
}

/** A run granted by a tick: a lease on the task, plus the slot it runs. */
export class Run extends Lease {
  readonly run = true as const;
  /** Coordinated through the store: this is the one run of the slot. */
  readonly gated = true as const;

  constructor(
    client: LeaseholdClient,
    readonly task: string,
    /** The slot: ms since the epoch of the firing this run is for (a manual run: when it was asked for). */
    readonly slot: number,
    token: string,
    holder: string,
    sentAt: number,
    validForMs: number,
    keepaliveMs: number,
    /**
     * `timer` for the schedule's slot on time, `catch-up` for a slot run late (within
     * `catchUpWindowMs`), `manual` for a run asked for with `trigger` (or `leasehold trigger`),
     * `retry` for a slot run again (`retries`, or a run that was cut off).
     */
    readonly trigger: "timer" | "catch-up" | "manual" | "retry" = "timer",
    /** Which attempt of the slot this is: 1, then 2, 3, ... for retries and re-runs. */
    readonly attempt: number = 1,
    /** The lease kept for the run: the task's, or a run lease of its own (overlap `allow`). */
    lease: string = task,
  ) {
    super(client, lease, token, holder, sentAt, validForMs, keepaliveMs);
  }

  /**
   * Ends the run: records its outcome in the task's history and releases the task lease.
   * `output`: what the run printed, kept in its record (its last 64 KiB; shown by `leasehold
   * history --output` and the page).
   */
  async done(outcome: "ok" | "failed", error?: string, output?: string): Promise<boolean> {
    // The run is over either way; done is still sent after a loss, so the history has it.
    this.end("done");
    const body: Json = { token: this.token, outcome };
    if (error !== undefined) body.error = error.slice(0, 2000);
    if (output !== undefined) body.output = outputTail(output);
    const answer = await this.client.post(`/v1/tasks/${enc(this.task)}/ticks/${this.slot}/done`, body);
    return answer.released === true;
  }
}

/** A run the store-down policy allowed without coordination: no token, never aborted. */
export interface UngatedRun {
  run: true;
  gated: false;
  task: string;
  slot: number | null;
  /** No fencing token: nothing coordinated this run. */
  token: null;
  signal: AbortSignal;
  done(outcome: "ok" | "failed", error?: string, output?: string): Promise<boolean>;
}

/** The sidecar keeps a run's output up to its last this many bytes of UTF-8. */
const OUTPUT_BYTES_LIMIT = 65536;

/**
 * The end of `output` the sidecar keeps: its last {@link OUTPUT_BYTES_LIMIT} bytes of UTF-8,
 * from a character boundary (so the body stays within the sidecar's size limit).
 */
function outputTail(output: string): string {
  // Encoding also replaces a lone surrogate (which the sidecar's JSON parser refuses) by U+FFFD.
  const bytes = new TextEncoder().encode(output);
  let start = Math.max(0, bytes.length - OUTPUT_BYTES_LIMIT);
  // Past the continuation bytes (10xxxxxx) of a character the cut went through.
  while (start < bytes.length && (bytes[start] & 0xc0) === 0x80) start++;
  return new TextDecoder().decode(bytes.subarray(start));
}

/** @internal */
export interface RequestOptions {
  /** How long the sidecar may hold the request before it answers (added to the timeout). */
  waitMs?: number;
  /** Cancels the request. */
  signal?: AbortSignal;
}

/**
 * A lease, group or task name as one path segment. fetch resolves `.` and `..` segments away,
 * `%2E` included (WHATWG URL), so their dots go as `%252E`: names never hold `%`, and the
 * sidecar reads a `%2E` left after decoding a path as a dot.
 */
const enc = (s: string) => (s === "." || s === ".." ? s.replace(/\./g, "%252E") : encodeURIComponent(s));
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** How often, and how far apart, `gate` asks again when the task is busy. */
const BUSY_RETRIES = 4;
const BUSY_RETRY_MS = 100;
/**
 * The longest `tick` waits for a slot the sidecar says is about to start (`starts_in_ms` with
 * the slot: the tick came early, on a clock ahead of the store's). The sidecar only names a
 * slot within min(1 s, a quarter of its interval); a longer wait is not that.
 */
const MAX_EARLY_WAIT_MS = 1_000;

export class LeaseholdClient {
  readonly baseUrl: string;
  readonly #auth?: string;
  readonly onSidecarDown: SidecarDownPolicy;
  readonly timeoutMs: number;
  /** This application instance's id, sent with every tick and lease request. */
  readonly instance: string;

  constructor(options: ClientOptions = {}) {
    this.baseUrl = (options.baseUrl ?? process.env.LEASEHOLD_SIDECAR ?? "http://127.0.0.1:7070").replace(/\/$/, "");
    this.#auth = options.authToken;
    this.onSidecarDown = options.onSidecarDown ?? "fail-closed";
    this.timeoutMs = options.timeoutMs ?? 10_000;
    this.instance = options.instance ?? process.env.LEASEHOLD_INSTANCE ?? defaultInstance();
  }

  /**
   * @internal One request; JSON in and out; error answers become LeaseholdError. `waitMs`: how
   * long the sidecar may hold the request (long-polls), on top of the timeout.
   */
  async request(method: string, path: string, body?: Json, opts: RequestOptions = {}): Promise<Json> {
    const headers: Record<string, string> = { "content-type": "application/json" };
    if (this.#auth) headers.authorization = `Bearer ${this.#auth}`;
    const limit = this.timeoutMs + (opts.waitMs ?? 0);
    const timeout = AbortSignal.timeout(limit);
    const signal = opts.signal ? AbortSignal.any([timeout, opts.signal]) : timeout;
    let response: Response;
    let text: string;
    try {
      response = await fetch(this.baseUrl + path, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        signal,
      });
      text = await response.text();
    } catch (e) {
      const why = timeout.aborted ? `no answer within ${limit} ms` : (e as Error).message;
      throw new LeaseholdError(`sidecar ${this.baseUrl} unreachable: ${why}`, 0, "sidecar-down");
    }
    let json: Json;
    try {
      json = JSON.parse(text) as Json;
    } catch {
      throw new LeaseholdError(`sidecar answered ${response.status} without JSON`, response.status, "bad-answer");
    }
    if (!response.ok) {
      throw new LeaseholdError(
        String(json.message ?? response.statusText),
        response.status,
        String(json.error ?? "error"),
        json.field as string | undefined,
        json.reason as string | undefined,
      );
    }
    return json;
  }

  /** @internal */
  post(path: string, body: Json, opts?: RequestOptions): Promise<Json> {
    return this.request("POST", path, body, opts);
  }

  /** Takes `name`, waiting up to `waitMs`; `null` when it stays busy. */
  async acquire(name: string, options: AcquireOptions): Promise<Lease | null> {
    return this.#take(`/v1/leases/${enc(name)}/acquire`, name, options);
  }

  /** Becomes the leader of `group` (a lease named after it); `null` when another leads. */
  async campaign(group: string, options: AcquireOptions): Promise<Lease | null> {
    return this.#take(`/v1/groups/${enc(group)}/campaign`, group, options);
  }

  async #take(path: string, name: string, o: AcquireOptions): Promise<Lease | null> {
    const body: Json = { ttl_ms: o.ttlMs, instance: this.instance };
    if (o.waitMs !== undefined) body.wait_ms = o.waitMs;
    if (o.keepaliveMs !== undefined) body.keepalive_ms = o.keepaliveMs;
    if (o.holder !== undefined) body.holder = o.holder;
    const sentAt = performance.now();
    const answer = await this.post(path, body, { waitMs: o.waitMs });
    if (answer.acquired !== true) return null;
    return new Lease(
      this,
      name,
      String(answer.token),
      String(answer.holder),
      sentAt,
      Number(answer.valid_for_ms),
      Number(answer.keepalive_ms),
    );
  }

  /** The group's current leader and term token. */
  async leader(group: string): Promise<GroupState> {
    return (await this.request("GET", `/v1/groups/${enc(group)}`)) as unknown as GroupState;
  }

  /**
   * Waits (up to `waitMs`, default 30 s) until the group's term differs from `token` (`null`:
   * nobody leads), then answers the group's state. Loop on it to follow the leadership.
   */
  async observe(group: string, token: string | null = null, waitMs = 30_000): Promise<GroupState> {
    const answer = await this.post(`/v1/groups/${enc(group)}/observe`, { token, wait_ms: waitMs }, { waitMs });
    return answer as unknown as GroupState;
  }

  /** Every task in the store's catalog, with the store's clock. */
  async tasks(): Promise<{ now_ms: number; tasks: TaskSummary[] }> {
    return (await this.request("GET", "/v1/tasks")) as unknown as { now_ms: number; tasks: TaskSummary[] };
  }

  /**
   * One task with its newest `limit` history entries (default 50, at most 500) and its misses of
   * the last 24 hours. `name` is also the `--lease` of a `leasehold run` task. Rejects with
   * `unknown-task` (404).
   */
  async task(name: string, options: { limit?: number } = {}): Promise<TaskDetail> {
    const query = options.limit === undefined ? "" : `?limit=${options.limit}`;
    return (await this.request("GET", `/v1/tasks/${enc(name)}${query}`)) as unknown as TaskDetail;
  }

  /** Lease records in the store (tasks' run leases, leader groups, applications' leases). */
  async leases(): Promise<{ now_ms: number; leases: LeaseEntry[] }> {
    return (await this.request("GET", "/v1/leases")) as unknown as { now_ms: number; leases: LeaseEntry[] };
  }

  /**
   * Pauses `name` on every instance from their next tick (slots are recorded as paused and never
   * caught up; a run going finishes); resolves to the task. Rejects with `unknown-task` (404).
   */
  async pause(name: string, options: { reason?: string; by?: string } = {}): Promise<TaskSummary> {
    const body: Json = {};
    if (options.reason !== undefined) body.reason = options.reason;
    if (options.by !== undefined) body.by = options.by;
    return (await this.post(`/v1/tasks/${enc(name)}/pause`, body)) as unknown as TaskSummary;
  }

  /** Lifts `name`'s pause; resolves to the task. */
  async resume(name: string): Promise<TaskSummary> {
    return (await this.post(`/v1/tasks/${enc(name)}/resume`, {})) as unknown as TaskSummary;
  }

  /**
   * Asks whichever instance runs `name` to run it once, as soon as it can; resolves to the
   * request, whose `id` the run's history entry carries (`task(name).history[i].request.id`).
   * Rejects with `no-instance` (409) when no instance runs it, `unknown-task` (404).
   */
  async trigger(name: string, options: { by?: string } = {}): Promise<TriggerRequest> {
    const body: Json = options.by === undefined ? {} : { by: options.by };
    return (await this.post(`/v1/tasks/${enc(name)}/trigger`, body)) as unknown as TriggerRequest;
  }

  /**
   * Backfill (`leasehold trigger --slots`): asks whichever instance runs `name` to run each of
   * its past slots from `fromMs` to `toMs` (both included, store clock) that has no ok run in
   * its history, oldest first, one at a time, each holding the task lease; the runs are in the
   * history as trigger `backfill` with the request's id. The same backfill again asks for
   * nothing (`request: null`). Rejects with `bad-request` (400) for a range that ends before it
   * starts or after now (field `to_ms`) or holds more than 1000 slots (field `from_ms`);
   * `no-instance`, `no-backfill` (a task an application runs through the sidecar),
   * `trigger-waiting` (409); `unknown-task` (404).
   */
  async backfill(
    name: string,
    options: { fromMs: number; toMs: number; by?: string },
  ): Promise<BackfillAnswer> {
    const body: Json = { from_ms: options.fromMs, to_ms: options.toMs };
    if (options.by !== undefined) body.by = options.by;
    return (await this.post(`/v1/tasks/${enc(name)}/backfill`, body)) as unknown as BackfillAnswer;
  }

  /**
   * Removes `name`, which no instance runs any more, from the catalog with its pause and pending
   * trigger (its history too with `history: true`). Rejects with `task-live` (409), nothing
   * removed, while an instance runs it, `unknown-task` (404).
   */
  async forget(name: string, options: { history?: boolean } = {}): Promise<Forgotten> {
    const body: Json = options.history === undefined ? {} : { history: options.history };
    return (await this.post(`/v1/tasks/${enc(name)}/forget`, body)) as unknown as Forgotten;
  }

  /**
   * The gated tick: call it from your own timer. Resolves to a `Run` on exactly one caller per
   * slot of the task (across every sidecar on the store), otherwise to why not. A tick that came
   * a little early (this host's clock ahead of the store's) is for the slot about to start: when
   * the sidecar answers that it has not started yet (`starts_in_ms` with the slot), this waits
   * that long and ticks again, so the run never starts before its slot.
   */
  async tick(task: string, options: TickOptions): Promise<Run | UngatedRun | NotRun> {
    let answer = await this.#tickOnce(task, options);
    for (let i = 0; i < 3 && answer.early !== undefined; i++) {
      await sleep(answer.early);
      answer = await this.#tickOnce(task, options);
    }
    return answer.result;
  }

  async #tickOnce(task: string, options: TickOptions): Promise<{ result: Run | UngatedRun | NotRun; early?: number }> {
    const body: Json = "everyMs" in options ? { every_ms: options.everyMs } : { cron: options.cron };
    if ("cron" in options && options.timeZone !== undefined) body.time_zone = options.timeZone;
    if (options.group !== undefined) body.group = options.group;
    if (options.ttlMs !== undefined) body.ttl_ms = options.ttlMs;
    if (options.keepaliveMs !== undefined) body.keepalive_ms = options.keepaliveMs;
    if (options.onStoreDown !== undefined) body.on_store_down = options.onStoreDown;
    if (options.catchUpWindowMs !== undefined) body.catch_up_window_ms = options.catchUpWindowMs;
    if (options.timeoutMs !== undefined) body.timeout_ms = options.timeoutMs;
    if (options.retries !== undefined) body.retries = options.retries;
    if (options.retryBackoffMs !== undefined) body.retry_backoff_ms = options.retryBackoffMs;
    if (options.retryBackoffMaxMs !== undefined) body.retry_backoff_max_ms = options.retryBackoffMaxMs;
    if (options.overlap !== undefined) body.overlap = options.overlap;
    if (options.jitterMs !== undefined) body.jitter_ms = options.jitterMs;
    if (options.onInterrupt !== undefined) body.on_interrupt = options.onInterrupt;
    if (options.history !== undefined) body.history = options.history;
    body.instance = this.instance;
    const sentAt = performance.now();
    const answer = await this.post(`/v1/tasks/${enc(task)}/ticks`, body);
    if (answer.run !== true) {
      const notRun: NotRun = { run: false, slot: answer.slot as number | null, reason: answer.reason as NotRun["reason"] };
      if (typeof answer.starts_in_ms === "number") notRun.startsInMs = answer.starts_in_ms;
      // The slot this tick is for has not started on the store's clock: wait for it.
      const early =
        notRun.reason === "not-due" && notRun.slot !== null && notRun.startsInMs !== undefined && notRun.startsInMs <= MAX_EARLY_WAIT_MS
          ? notRun.startsInMs
          : undefined;
      return { result: notRun, early };
    }
    if (answer.gated === false) return { result: ungated(task, answer.slot as number | null) };
    const run = new Run(
      this,
      task,
      Number(answer.slot),
      String(answer.token),
      "",
      sentAt,
      Number(answer.valid_for_ms),
      Number(answer.keepalive_ms),
      answer.trigger === "manual" || answer.trigger === "catch-up" || answer.trigger === "retry" ? answer.trigger : "timer",
      typeof answer.attempt === "number" ? answer.attempt : 1,
      typeof answer.lease === "string" ? answer.lease : task,
    );
    return { result: run };
  }

  /**
   * Ticks, and if this caller runs the slot, runs `job` with the run (its `signal` aborts if the
   * run's lease is lost) and ends the run with the job's outcome. Resolves to `ran` or the reason
   * it did not run; a `busy` answer is asked again up to 4 times, 100 ms apart, so a slot whose
   * task is still held by a finishing run (a replica shutting down) is not missed. When the
   * sidecar cannot be reached (refused, or no answer within
   * `timeoutMs`), `onSidecarDown` decides: `fail-closed` resolves to `sidecar-down` without
   * running, `fail-open` runs the job ungated. Other errors (bad input, auth) reject.
   */
  async gate(task: string, options: TickOptions, job: (run: Run | UngatedRun) => Promise<void>): Promise<GateResult> {
    let answer: Run | UngatedRun | NotRun;
    try {
      answer = await this.tick(task, options);
      // Busy: another instance's run holds the task (often the previous slot's run, finishing
      // on a replica that is shutting down). Ask again shortly rather than at the next timer
      // firing, by which time this slot may no longer be the latest and would be missed; the
      // sidecar's lease and slot claim still decide who runs.
      for (let i = 0; answer.run === false && answer.reason === "busy" && i < BUSY_RETRIES; i++) {
        await sleep(BUSY_RETRY_MS);
        answer = await this.tick(task, options);
      }
    } catch (e) {
      if (!(e instanceof LeaseholdError)) throw e;
      if (e.code === "store-down") return "store-down";
      if (e.code !== "sidecar-down") throw e;
      if (this.onSidecarDown !== "fail-open") return "sidecar-down";
      // Ungated, on this instance's own clock: the slot the schedule would have.
      const slot = "everyMs" in options ? Math.floor(Date.now() / options.everyMs) * options.everyMs : null;
      answer = ungated(task, slot);
    }
    if (answer.run === false) return answer.reason;
    try {
      await job(answer);
    } catch (e) {
      await answer.done("failed", String(e)).catch(() => false);
      return "failed";
    }
    await answer.done("ok").catch(() => false);
    return "ran";
  }
}

function ungated(task: string, slot: number | null): UngatedRun {
  return {
    run: true,
    gated: false,
    task,
    slot,
    token: null,
    signal: new AbortController().signal,
    done: async () => false,
  };
}
