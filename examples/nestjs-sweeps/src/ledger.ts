import { appendFileSync } from "node:fs";

import { config } from "./config.js";

export interface Entry {
  worker: string;
  /** `start` when a sweep begins, `end` when it has finished (the e2e test checks both). */
  phase: "start" | "end";
  slot: number | null;
  token: string | null;
  /** The run's trigger (`timer`, `catch-up`, `retry`, ...; `ungated` when the store was down). */
  trigger: string;
  /** 1, then 2, ... when a cut-off run of the slot is run again. */
  attempt: number;
  start: number;
  end?: number;
}

/** One line per sweep start and end: which replica ran which slot, under which fencing token. */
export function record(entry: Entry): void {
  appendFileSync(config.ledger, JSON.stringify({ ...entry, replica: config.replica }) + "\n");
}
