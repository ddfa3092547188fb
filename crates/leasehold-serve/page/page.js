// The leasehold sidecar's live page. Plain JavaScript, no build step, nothing fetched but this
// sidecar's own API.
//
// Live updates poll once a second rather than use server-sent events: EventSource cannot send
// the bearer token (no request headers), the data comes from store reads that have no change
// feed to stream, and a poll is a short request the sidecar's connection bounds already fit,
// where a stream would hold a connection (and a slot of --max-connections) per open tab.
"use strict";

const POLL_MS = 1000;
const REQUEST_TIMEOUT_MS = 5000;
const HISTORY_LIMIT = 100;
const TOKEN_KEY = "leasehold-token";
const BY_KEY = "leasehold-by";

// ---- small helpers -------------------------------------------------------------------------

/** An element with attributes (`on…` functions become listeners) and children. */
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

const $ = (id) => document.getElementById(id);

function utc(ms) {
  if (ms === null || ms === undefined) return "—";
  return new Date(ms).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}

/** `1.2 s`, `3 min 4 s`, `2 h 5 min`. */
function span(ms) {
  if (ms === null || ms === undefined) return "—";
  const a = Math.abs(ms);
  if (a < 1000) return `${Math.round(a)} ms`;
  if (a < 60000) return `${(a / 1000).toFixed(a < 10000 ? 1 : 0)} s`;
  const s = Math.round(a / 1000);
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

/** A time as "3.2 s ago" / "in 4 s" against the store's clock, with the UTC time as title. */
function when(ms, now) {
  if (ms === null || ms === undefined) return h("span", {}, "—");
  const d = ms - now;
  const text = Math.abs(d) < 500 ? "now" : d < 0 ? `${span(-d)} ago` : `in ${span(d)}`;
  return h("time", { datetime: new Date(ms).toISOString(), title: utc(ms) }, text);
}

/** Holder ids are long (`host:pid:128-bit`): the host and pid, with the whole id as title. */
function holder(id) {
  if (!id) return h("span", { class: "muted" }, "free");
  const m = /^(.*:\d+):[0-9a-f]{12,}$/.exec(id);
  const short = m ? m[1] : id.length > 40 ? id.slice(0, 39) + "…" : id;
  return h("span", { class: "holder", title: id }, short);
}

const STATE_TEXT = { running: "running", idle: "idle", paused: "paused", no_instance: "no instance", failing: "failing" };

/** A task's state; `failing` says how many runs failed in a row. */
function stateBadge(task) {
  const text = STATE_TEXT[task.state] || task.state;
  const n = task.consecutive_failures || 0;
  return h("span", { class: `badge state-${task.state}`, title: n ? `${n} runs failed in a row` : null },
    task.state === "failing" ? `${text} (${n})` : text);
}

/** When the task last succeeded, for a task whose last runs failed. */
function lastSuccess(task, now) {
  if (!task.consecutive_failures) return null;
  return h("span", { class: "small" }, "last success: ",
    task.last_success_ms ? when(task.last_success_ms, now) : "none recorded");
}

/** The fleet shows only failing tasks with `?state=failing` (the checkbox above the table). */
let onlyFailing = new URLSearchParams(location.search).get("state") === "failing";

function failingFilter(tasks) {
  const failing = tasks.filter((t) => t.consecutive_failures > 0).length;
  return h("label", { class: "filter" },
    h("input", {
      type: "checkbox", id: "only-failing", checked: onlyFailing,
      onchange: (e) => {
        onlyFailing = e.target.checked;
        const url = new URL(location.href);
        if (onlyFailing) url.searchParams.set("state", "failing");
        else url.searchParams.delete("state");
        history.replaceState(null, "", url);
        refreshNow();
      },
    }),
    ` Only failing tasks (${failing})`);
}

function outcomeBadge(run) {
  const outcome = run.paused ? "paused" : run.outcome;
  return h("span", { class: `badge outcome-${outcome}`, title: run.error || null }, outcome);
}

/**
 * `text` as one path segment. Browsers resolve `.` and `..` segments away, `%2E` included
 * (WHATWG URL), so their dots are written `%252E`: names never hold `%`, and the sidecar reads a
 * `%2E` left after decoding a path as a dot.
 */
function segment(text) {
  return text === "." || text === ".." ? text.replace(/\./g, "%252E") : encodeURIComponent(text);
}

/** A task's API address: its name as one path segment. */
function taskApi(name) {
  return `/v1/tasks/${segment(name)}`;
}

/** The task named by a page address `/tasks/NAME`, as the sidecar reads it. */
function taskOfPath(path) {
  const m = /^\/tasks\/(.+)$/.exec(path);
  if (!m) return null;
  return decodeURIComponent(m[1]).replace(/%2E/gi, ".");
}

/**
 * A task page's address, by the name people know (see shownName) when no other task has it:
 * `/tasks/` and the name, each of its `/`-separated parts a segment, so `billing/expire` reads
 * as itself.
 */
function taskHref(task, names) {
  const shown = shownName(task);
  const name = shown !== task.name && names && names.has(shown) ? task.name : shown;
  return `/tasks/${name.split("/").map((part) => segment(part).replace(/%3A/g, ":")).join("/")}`;
}

/** A `leasehold run --lease NAME` task is filed as `NAME:run`; people know it as NAME. */
function shownName(task) {
  return task.definition && task.definition.source === "run" && task.name.endsWith(":run")
    ? task.name.slice(0, -4)
    : task.name;
}

// ---- the API -------------------------------------------------------------------------------

class ApiFailure extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

/** Calls the API with the token if one was given; throws ApiFailure with the server's words. */
async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  const t = token();
  if (t) headers.Authorization = `Bearer ${t}`;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const abort = new AbortController();
  const timer = setTimeout(() => abort.abort(), REQUEST_TIMEOUT_MS);
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: abort.signal,
      cache: "no-store",
    });
  } catch (e) {
    throw new ApiFailure(0, "unreachable", e.name === "AbortError"
      ? `no answer within ${REQUEST_TIMEOUT_MS / 1000} s`
      : "the sidecar cannot be reached");
  } finally {
    clearTimeout(timer);
  }
  const text = await response.text();
  if (response.ok) {
    const type = response.headers.get("content-type") || "";
    return type.includes("json") ? JSON.parse(text) : text;
  }
  let code = `http-${response.status}`;
  let message = text.slice(0, 300) || response.statusText;
  try {
    // Both error shapes: {"error": {"code", "message"}} and {"error": code, "message"}.
    const e = JSON.parse(text);
    if (e.error && typeof e.error === "object") {
      code = e.error.code || code;
      message = e.error.message || message;
    } else if (e.error) {
      code = e.error;
      message = e.message || message;
    }
  } catch (_) { /* not JSON: keep the text */ }
  if (response.status === 401) needToken(message);
  throw new ApiFailure(response.status, code, message);
}

// ---- the token -----------------------------------------------------------------------------

function needToken(message) {
  const form = $("auth");
  $("token-open").hidden = false;
  $("auth-why").textContent = token()
    ? `401 Unauthorized: the sidecar refused the token given (${message}). Enter the right one.`
    : `401 Unauthorized: this sidecar needs its bearer token (${message}). Enter it to see the fleet and use the buttons.`;
  form.classList.add("error");
  if (form.hidden) {
    form.hidden = false;
    $("token").focus();
  }
}

function setUpToken() {
  const form = $("auth");
  $("token-open").hidden = !token();
  $("token-open").addEventListener("click", () => {
    form.hidden = !form.hidden;
    if (!form.hidden) {
      $("auth-why").textContent = token() ? "A token is set for this tab." : "No token is set.";
      form.classList.remove("error");
      $("token").focus();
    }
  });
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const value = $("token").value.trim();
    if (value) sessionStorage.setItem(TOKEN_KEY, value);
    $("token").value = "";
    form.hidden = true;
    say(value ? "Token saved for this tab." : "No token entered.");
    refreshNow();
  });
  $("token-forget").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    $("token").value = "";
    say("Token forgotten.");
    refreshNow();
  });
  $("token-close").addEventListener("click", () => { form.hidden = true; });
}

// ---- the result line and the live indicator -------------------------------------------------

function say(text, failed) {
  const el = $("result");
  el.textContent = text;
  el.classList.toggle("error", !!failed);
}

function failureText(what, e) {
  if (e.status === 401) return `${what}: 401 Unauthorized — ${e.message}. Enter the token above.`;
  return `${what}: ${e.status ? e.status + " " : ""}${e.code} — ${e.message}`;
}

function live(ok, text) {
  const el = $("live");
  el.textContent = text;
  el.classList.toggle("down", !ok);
}

// ---- pause, resume, trigger, forget --------------------------------------------------------

const ACTIONS = {
  pause: {
    label: "Pause",
    text: (n) => `Pause ${n} on every instance? Its slots are skipped (recorded as paused, never caught up) until it is resumed.`,
    body: (reason, by) => ({ reason: reason || null, by: by || null }),
    done: (n) => `Paused ${n}.`,
  },
  resume: {
    label: "Resume",
    text: (n) => `Resume ${n}? Its next due slot runs as usual; paused slots are not caught up.`,
    body: () => undefined,
    done: (n) => `Resumed ${n}.`,
  },
  trigger: {
    label: "Trigger",
    text: (n) => `Run ${n} once now? The instance that runs it picks the request up (within its next tick) and runs it holding the task's lease.`,
    body: (_, by) => ({ by: by || null }),
    done: (n, r) => `Trigger of ${n} requested (id ${r.id}); it expires ${utc(r.expires_ms)} unless an instance takes it.`,
  },
  forget: {
    label: "Forget",
    text: (n) => `Remove ${n} from the catalog, with its pause and pending trigger? No instance runs it now; its run history is kept. An instance started with it later registers it afresh.`,
    body: () => undefined,
    done: (n) => `Forgot ${n}.`,
  },
};

let confirming = null;

function ask(action, task) {
  const a = ACTIONS[action];
  const name = shownName(task);
  confirming = { action, task: task.name, name };
  $("confirm-title").textContent = `${a.label} ${name}?`;
  $("confirm-text").textContent = a.text(name);
  $("confirm-reason-row").hidden = action !== "pause";
  $("confirm-reason").value = "";
  // Who asked: kept for this tab, so it is typed once.
  $("confirm-by-row").hidden = action === "resume" || action === "forget";
  $("confirm-by").value = sessionStorage.getItem(BY_KEY) || "";
  $("confirm-ok").textContent = a.label;
  $("confirm").showModal();
  (action === "pause" ? $("confirm-reason") : $("confirm-ok")).focus();
}

async function act() {
  const { action, task, name } = confirming;
  const a = ACTIONS[action];
  say(`${a.label} ${name}…`);
  try {
    const by = $("confirm-by").value.trim();
    if (by) sessionStorage.setItem(BY_KEY, by);
    const r = await api("POST", `${taskApi(task)}/${action}`,
      a.body($("confirm-reason").value.trim(), by));
    say(a.done(name, r));
  } catch (e) {
    say(failureText(`${a.label} ${name} failed`, e), true);
  }
  refreshNow();
}

function setUpConfirm() {
  const dialog = $("confirm");
  // Enter in a text field confirms (the form's default button would be Cancel, the first).
  for (const field of ["confirm-reason", "confirm-by"]) {
    $(field).addEventListener("keydown", (e) => {
      if (e.key === "Enter") {
        e.preventDefault();
        dialog.close("ok");
      }
    });
  }
  dialog.addEventListener("close", () => {
    if (dialog.returnValue === "ok" && confirming) act();
    dialog.returnValue = "";
  });
}

function buttons(task) {
  const paused = !!task.paused;
  const live = (task.instances || []).some((i) => i.live);
  const name = shownName(task);
  return h("div", { class: "buttons" },
    h("button", { type: "button", disabled: paused, "aria-label": `Pause ${name}`,
      onclick: () => ask("pause", task) }, "Pause"),
    h("button", { type: "button", disabled: !paused, "aria-label": `Resume ${name}`,
      onclick: () => ask("resume", task) }, "Resume"),
    h("button", { type: "button", disabled: !live, "aria-label": `Trigger ${name}`,
      title: live ? null : "no instance runs it now: nobody would take the trigger",
      onclick: () => ask("trigger", task) }, "Trigger"),
    h("button", { type: "button", disabled: live, "aria-label": `Forget ${name}`,
      title: live ? "an instance runs it: stop it first" : null,
      onclick: () => ask("forget", task) }, "Forget"));
}

// ---- the fleet view ------------------------------------------------------------------------

/** Tables become labelled cards at phone width: every cell says which column it is. */
function table(caption, head, rows, empty) {
  if (!rows.length) return h("p", { class: "muted" }, empty);
  return h("div", { class: "table-wrap" }, h("table", { class: "cards" },
    caption ? h("caption", { class: "visually-hidden" }, caption) : null,
    h("thead", {}, h("tr", {}, head.map((c) => h("th", { scope: "col" }, c)))),
    h("tbody", {}, rows.map((cells) => h("tr", {},
      cells.map((c, i) => h("td", { "data-label": head[i] }, c)))))));
}

function lastRun(run, now) {
  if (!run) return h("span", { class: "muted" }, "none yet");
  return h("div", { class: "stack" },
    h("span", {}, outcomeBadge(run), " ", when(run.started_ms ?? run.slot_ms, now)),
    run.error ? h("span", { class: "small error" }, run.error) : null,
    h("span", { class: "small" }, "on ", holder(run.holder),
      run.duration_ms !== null && run.duration_ms !== undefined ? ` · ${span(run.duration_ms)}` : ""));
}

/** The leader of a task's group, or the holder of its run lease. */
function owner(task, leasesByName) {
  const group = task.definition && task.definition.leader_group;
  const parts = [];
  if (group) {
    const lease = leasesByName.get(group);
    parts.push(h("span", { class: "small" }, "leader: ", holder(lease && lease.holder)));
  }
  if (task.lease) {
    parts.push(h("span", { class: "small" }, "running: ", holder(task.lease.holder),
      ` · token ${task.lease.token}`));
  }
  if (!parts.length) parts.push(h("span", { class: "muted" }, "—"));
  return h("div", { class: "stack" }, parts);
}

function instancesCell(task) {
  const all = task.instances || [];
  const liveOnes = all.filter((i) => i.live);
  return h("span", { title: all.map((i) => `${i.instance}${i.live ? "" : " (gone)"}`).join("\n") || null },
    `${liveOnes.length} live` + (all.length > liveOnes.length ? ` / ${all.length}` : ""));
}

// Reasons of the misses in the last 24 h, fetched per task only when its count changes.
const missCache = new Map();

function missedCell(task, names) {
  const n = task.missed_24h || 0;
  if (!n) return h("span", { class: "muted" }, "0");
  const cached = missCache.get(task.name);
  if (!cached || cached.count !== n) {
    missCache.set(task.name, { count: n, text: cached ? cached.text : "" });
    api("GET", `${taskApi(task.name)}?limit=1`).then((d) => {
      const reasons = new Map();
      for (const m of d.missed || []) reasons.set(m.reason, (reasons.get(m.reason) || 0) + (m.count || 1));
      const text = [...reasons].map(([r, c]) => `${c} ${r}`).join(", ");
      missCache.set(task.name, { count: n, text });
    }).catch(() => missCache.delete(task.name));
  }
  const text = missCache.get(task.name).text;
  return h("a", { href: `${taskHref(task, names)}#missed`, class: "missed" },
    String(n), text ? h("span", { class: "small" }, ` (${text})`) : null);
}

function renderFleet(main, tasks, leases) {
  const now = tasks.now_ms;
  const byName = new Map(leases.leases.map((l) => [l.name, l]));
  const names = new Set(tasks.tasks.map((t) => t.name));
  const groups = new Map();
  for (const t of tasks.tasks) {
    const g = t.definition && t.definition.leader_group;
    if (g) groups.set(g, [...(groups.get(g) || []), shownName(t)]);
  }
  const shown = onlyFailing ? tasks.tasks.filter((t) => t.consecutive_failures > 0) : tasks.tasks;
  const taskRows = shown.map((t) => [
    h("a", { href: taskHref(t, names), class: "task-name" }, shownName(t)),
    h("span", { class: "stack" }, stateBadge(t), lastSuccess(t, now),
      t.paused ? h("span", { class: "small" }, `by ${t.paused.by}${t.paused.reason ? ": " + t.paused.reason : ""}`) : null,
      t.trigger ? h("span", { class: "small" }, `${t.trigger.slots ? "backfill" : "trigger"} pending (${t.trigger.by})`) : null),
    owner(t, byName),
    lastRun(t.last_run, now),
    t.paused ? h("span", { class: "muted" }, "paused") : when(t.next_slot_ms, now),
    missedCell(t, names),
    instancesCell(t),
    buttons(t),
  ]);
  const groupRows = [...groups].map(([g, names]) => {
    const l = byName.get(g);
    return [g, names.join(", "), holder(l && l.holder), l && l.token !== null ? String(l.token) : "—",
      l && l.holder ? span(l.remaining_ms) : "—"];
  });
  const leaseRows = leases.leases.filter((l) => !groups.has(l.name)).map((l) => [
    l.name, names.has(l.name) ? "task's run lease" : "lease", holder(l.holder),
    l.token !== null ? String(l.token) : "—", l.holder ? span(l.remaining_ms) : "—",
  ]);
  main.replaceChildren(
    h("section", { id: "tasks", "aria-labelledby": "tasks-h" },
      h("h1", { id: "tasks-h" }, "Tasks"),
      failingFilter(tasks.tasks),
      table("Tasks", ["Task", "State", "Leader / owner", "Last run", "Next due", "Missed (24 h)",
        "Instances", "Actions"], taskRows,
      onlyFailing ? "No task is failing." :
        "No tasks in this store's catalog yet: start `leasehold run --every …` or a scheduler on this store.")),
    h("section", { id: "groups", "aria-labelledby": "groups-h" },
      h("h2", { id: "groups-h" }, "Leader groups"),
      table("Leader groups", ["Group", "Tasks", "Leader", "Token", "Remaining"], groupRows,
        "No task runs in a leader group.")),
    h("section", { id: "leases", "aria-labelledby": "leases-h" },
      h("h2", { id: "leases-h" }, "Leases"),
      table("Leases", ["Lease", "Kind", "Holder", "Token", "Remaining"], leaseRows, "No leases.")));
}

// ---- the task view -------------------------------------------------------------------------

function facts(pairs) {
  return h("dl", { class: "facts" }, pairs.filter(([, v]) => v !== null && v !== undefined)
    .map(([k, v]) => h("div", {}, h("dt", {}, k), h("dd", {}, v))));
}

let svgKey = null;
let svgAt = 0;

/** The timeline picture, fetched again when the history changes (or every 10 s while a run
 * goes on). Its tooltips become focusable, so the keyboard reaches what hover shows. */
async function loadTimeline(figure, task, key) {
  const now = Date.now();
  const running = task.state === "running";
  if (key === svgKey && !(running && now - svgAt > 10000)) return;
  svgKey = key;
  svgAt = now;
  const box = figure.querySelector(".timeline");
  try {
    const text = await api("GET",
      `${taskApi(task.name)}/history.svg?limit=${HISTORY_LIMIT}`);
    const doc = new DOMParser().parseFromString(text, "image/svg+xml");
    const svg = doc.documentElement;
    if (svg.nodeName !== "svg") throw new ApiFailure(0, "bad-svg", "the picture could not be read");
    svg.removeAttribute("width");
    svg.removeAttribute("height");
    svg.setAttribute("role", "group");
    svg.setAttribute("aria-label", `Run history timeline of ${task.name}`);
    for (const title of [...svg.querySelectorAll("title")]) {
      const mark = title.parentElement;
      mark.setAttribute("tabindex", "0");
      mark.setAttribute("role", "img");
      mark.setAttribute("aria-label", title.textContent);
      mark.dataset.tip = title.textContent;
      title.remove();
    }
    // Keep the keyboard on the same bar or marker across a redraw.
    const active = document.activeElement;
    const had = active && box.contains(active) ? focusId(active) : null;
    box.replaceChildren(document.importNode(svg, true));
    if (had) (findFocusable(had) || box).focus({ preventScroll: true });
  } catch (e) {
    svgKey = null;
    box.replaceChildren(h("p", { class: "error" }, failureText("The timeline could not be drawn", e)));
  }
}

function setUpTips() {
  const tip = $("tip");
  const show = (e) => {
    const el = e.target.closest && e.target.closest("[data-tip]");
    if (!el) return;
    tip.textContent = el.dataset.tip;
    tip.hidden = false;
    const r = el.getBoundingClientRect();
    const w = tip.offsetWidth;
    const x = Math.min(Math.max(8, r.left + r.width / 2 - w / 2), window.innerWidth - w - 8);
    tip.style.left = `${x + window.scrollX}px`;
    tip.style.top = `${r.bottom + window.scrollY + 6}px`;
  };
  const hide = (e) => {
    if (e.target.closest && e.target.closest("[data-tip]")) tip.hidden = true;
  };
  document.addEventListener("mouseover", show);
  document.addEventListener("focusin", show);
  document.addEventListener("mouseout", hide);
  document.addEventListener("focusout", hide);
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") tip.hidden = true; });
}

// The characters leasehold::text::is_hidden names (C0 but newline, DEL, C1, bidi controls, the
// line and paragraph separators, U+FFFE/FFFF): a run's output is untrusted text, shown in a
// <pre> with these written as escapes, as the CLI shows them.
const HIDDEN = /[\u0000-\u0009\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029\ufffe\uffff]/g;

function visibleLines(text) {
  return text.replace(HIDDEN, (c) => {
    const n = c.charCodeAt(0);
    if (c === "\r") return "\\r";
    if (c === "\t") return "\\t";
    if (c === "\0") return "\\0";
    return n <= 0x7f ? `\\x${n.toString(16).padStart(2, "0")}` : `\\u{${n.toString(16)}}`;
  });
}

// The runs whose output block is open, so the once-a-second redraw keeps it open.
const openOutputs = new Set();

/** A run's kept output as a collapsible block, closed unless opened. */
function outputBlock(r) {
  if (typeof r.output !== "string") return null;
  const key = `${r.holder} ${r.slot_ms ?? ""} ${r.started_ms ?? ""}`;
  return h("details", {
    class: "output",
    open: openOutputs.has(key),
    ontoggle: (e) => { if (e.target.open) openOutputs.add(key); else openOutputs.delete(key); },
  }, h("summary", { class: "small" }, `output (${r.output.length} characters)`),
  h("pre", {}, visibleLines(r.output)));
}

function runRows(history, now) {
  return history.map((r) => [
    r.slot_ms !== null && r.slot_ms !== undefined ? h("span", { title: utc(r.slot_ms) }, utc(r.slot_ms)) : "—",
    h("span", {}, r.trigger || "—", r.request ? h("span", { class: "small" }, ` by ${r.request.by}`) : null,
      r.attempt ? h("span", { class: "small" }, ` (attempt ${r.attempt})`) : null),
    holder(r.holder),
    r.token !== null && r.token !== undefined ? String(r.token) : "—",
    when(r.started_ms, now),
    span(r.duration_ms),
    h("span", { class: "stack" }, outcomeBadge(r),
      r.error ? h("span", { class: "small error" }, r.error) : null,
      r.missed && !r.paused ? h("span", { class: "small" },
        `${r.missed.count > 1 ? r.missed.count + " slots: " : ""}${r.missed.reason}`) : null,
      r.paused ? h("span", { class: "small" }, `paused by ${r.paused.by}${r.paused.reason ? ": " + r.paused.reason : ""}`) : null,
      outputBlock(r)),
  ]);
}

function renderTask(main, task, leases) {
  const now = task.now_ms ?? leases.now_ms;
  const d = task.definition;
  const byName = new Map(leases.leases.map((l) => [l.name, l]));
  const group = d && d.leader_group ? byName.get(d.leader_group) : null;
  const name = shownName(task);
  document.title = `${name} · leasehold`;
  let figure = main.querySelector("figure");
  if (!figure || figure.dataset.task !== task.name) {
    figure = h("figure", { "data-task": task.name },
      h("div", { class: "timeline", tabindex: "-1" }, h("p", { class: "muted" }, "Drawing the timeline…")),
      h("figcaption", { class: "small" },
        "Runs as bars coloured by outcome (manual runs outlined), missed and paused slots marked below. ",
        "Hover a bar or marker, or reach it with Tab, for its slot, holder, token and duration."));
    svgKey = null;
  }
  const history = task.history || [];
  const missed = task.missed || [];
  main.replaceChildren(
    h("p", { class: "crumbs" }, h("a", { href: "/" }, "← All tasks")),
    h("section", { "aria-labelledby": "task-h" },
      h("div", { class: "title-row" },
        h("h1", { id: "task-h" }, name, " ", stateBadge(task)),
        buttons(task)),
      facts([
        ["Task record", task.name !== name ? task.name : null],
        ["Schedule", d ? `${d.schedule}${d.time_zone ? " (" + d.time_zone + ")" : ""}` : "not registered by any instance"],
        ["Source", d ? d.source : null],
        ["Next due", task.paused ? "paused" : when(task.next_slot_ms, now)],
        ["Paused", task.paused ? `by ${task.paused.by} ${utc(task.paused.at_ms)}${task.paused.reason ? ": " + task.paused.reason : ""}` : null],
        ["Trigger pending", task.trigger ? h("span", {}, `${task.trigger.slots ? "backfill " : ""}by ${task.trigger.by}, expires `, when(task.trigger.expires_ms, now)) : null],
        ["Running on", task.lease ? h("span", {}, holder(task.lease.holder), ` · token ${task.lease.token} · ${span(task.lease.remaining_ms)} left`) : null],
        ["Leader group", d && d.leader_group ? h("span", {}, `${d.leader_group}: `, holder(group && group.holder),
          group && group.holder ? ` · token ${group.token} · ${span(group.remaining_ms)} left` : "") : null],
        ["Spread group", d && d.spread_group ? d.spread_group : null],
        ["Store down", d ? d.on_store_down : null],
        ["Catch-up", d && d.catch_up ? d.catch_up : null],
        ["Timeout", d && d.timeout_ms ? span(d.timeout_ms) : null],
        ["Retries", d && d.retries ? String(d.retries) : null],
        ["Jitter", d && d.jitter_ms ? `up to ${span(d.jitter_ms)}` : null],
        ["Overlap", d && d.overlap ? d.overlap : null],
        ["Last run", task.last_run ? lastRun(task.last_run, now) : "none yet"],
        ["Failed in a row", task.consecutive_failures ? String(task.consecutive_failures) : null],
        ["Last success", task.last_success_ms ? when(task.last_success_ms, now) : task.last_run ? "none recorded" : null],
      ])),
    h("section", { "aria-labelledby": "timeline-h" },
      h("h2", { id: "timeline-h" }, "Timeline"), figure),
    h("section", { id: "missed", "aria-labelledby": "missed-h" },
      h("h2", { id: "missed-h" }, `Missed in the last 24 h (${task.missed_24h ?? missed.length})`),
      missed.length
        ? h("ul", { class: "misses" }, missed.map((m) => h("li", {},
          m.count > 1 ? `${m.count} slots, ${utc(m.slot_ms)} to ${utc(m.last_slot_ms)}` : utc(m.slot_ms),
          " — ", h("strong", {}, m.reason))))
        : h("p", { class: "muted" }, "No missed slots.")),
    h("section", { "aria-labelledby": "instances-h" },
      h("h2", { id: "instances-h" }, "Instances"),
      table("Instances", ["Instance", "Live", "Heartbeat left", "Via sidecar", "Version", "Host", "PID"],
        (task.instances || []).map((i) => [holder(i.instance), i.live ? "yes" : "no",
          span(i.remaining_ms), i.via ? holder(i.via) : "—", i.version || "—", i.host || "—", i.pid ?? "—"]),
        "No instance has registered this task.")),
    h("section", { "aria-labelledby": "history-h" },
      h("h2", { id: "history-h" }, "Runs, newest first"),
      table("Runs", ["Slot", "Trigger", "Holder", "Token", "Started", "Duration", "Outcome"],
        runRows(history, now), "No runs recorded.")));
  const key = JSON.stringify([history[0], history.length, missed.length, task.paused]);
  loadTimeline(figure, task, key);
}

// ---- polling -------------------------------------------------------------------------------

let timer = null;
let inFlight = false;
let arrived = false;

function route() {
  const task = taskOfPath(location.pathname);
  return task === null ? {} : { task };
}

async function refresh() {
  if (inFlight) return;
  inFlight = true;
  clearTimeout(timer);
  const main = $("main");
  // Keep focus where it was across a re-render (the same button of the same task).
  const focused = document.activeElement;
  const focusKey = focused && focused !== document.body ? focusId(focused) : null;
  try {
    const r = route();
    const [data, leases] = await Promise.all([
      api("GET", r.task ? `${taskApi(r.task)}?limit=${HISTORY_LIMIT}` : "/v1/tasks"),
      api("GET", "/v1/leases"),
    ]);
    if (!$("confirm").open) {
      if (r.task) renderTask(main, data, leases);
      else renderFleet(main, data, leases);
      restoreFocus(focusKey);
      // The sections exist only once drawn: go to the one the address names, once.
      if (!arrived && location.hash) {
        const target = document.getElementById(decodeURIComponent(location.hash.slice(1)));
        if (target) target.scrollIntoView();
      }
      arrived = true;
    }
    // A token that works ends the 401 message.
    if ($("auth").classList.contains("error")) {
      $("auth").classList.remove("error");
      $("auth").hidden = true;
    }
    live(true, `live · ${new Date().toLocaleTimeString()}`);
  } catch (e) {
    if (e.status === 404 && e.code !== "http-404") {
      main.replaceChildren(h("h1", {}, "Not found"), h("p", {}, e.message), h("p", {}, h("a", { href: "/" }, "Back to the fleet")));
    } else if (e.status === 401 || !arrived) {
      // Nothing drawn yet (or nothing it may show): say why instead of an empty page.
      main.replaceChildren(h("p", { class: "error" }, failureText("Cannot read the fleet", e)));
    }
    live(false, e.status === 401 ? "needs the token (401)" : `not updating: ${e.message}`);
  } finally {
    inFlight = false;
    timer = setTimeout(refresh, POLL_MS);
  }
}

function refreshNow() {
  clearTimeout(timer);
  setTimeout(refresh, 0);
}

function focusId(el) {
  if (el.closest("dialog, #auth")) return null;
  return el.getAttribute("aria-label") || el.getAttribute("href") || el.id || null;
}

function findFocusable(key) {
  for (const el of document.querySelectorAll("#main [aria-label], #main [href], #main [id]")) {
    if (focusId(el) === key) return el;
  }
  return null;
}

function restoreFocus(key) {
  const el = key && findFocusable(key);
  if (el && !el.disabled && el !== document.activeElement) el.focus({ preventScroll: true });
}

document.addEventListener("DOMContentLoaded", () => {
  setUpToken();
  setUpConfirm();
  setUpTips();
  refresh();
});
