import { appendFileSync } from "node:fs";

import { config } from "./config.js";

export interface Entry {
  worker: string;
  slot: number | null;
  token: string | null;
  start: number;
  end: number;
}

/** One line per completed sweep: which replica ran which slot, under which fencing token. */
export function record(entry: Entry): void {
  appendFileSync(config.ledger, JSON.stringify({ ...entry, replica: config.replica }) + "\n");
}
