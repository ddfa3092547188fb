"""The next firing of cron expressions in IANA zones, by croniter and zoneinfo.

Reads JSON lines {"expr", "zone", "t"} (t: seconds since the epoch) on stdin and writes one
JSON line per case: {"rule": S, "raw": S, "raw_ruled": S, "full_day_field": B, "error": E}, S
the first firing
strictly after t in seconds since the epoch, E croniter's refusal (or null).

- "rule": croniter finds the wall-clock times the expression names (naive datetimes, no zone);
  zoneinfo turns each into an instant by leasehold's daylight-saving rule (a wall time that
  occurs twice fires at its first occurrence, one skipped by a change forward fires at the
  change). The answer is the earliest such instant after t. A day field (day-of-month,
  day-of-week) that allows every day is given to croniter as `*`, leasehold's rule, which
  croniter follows only when the other day field's text has a `*` in it; "full_day_field"
  says whether that happened.
- "raw": croniter's own answer for the expression as written, with a zone-aware start (its
  own daylight-saving handling); "raw_ruled" the same for the expression with a full day
  field written as `*`.
"""

import json
import sys
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

from croniter import croniter

SECOND = timedelta(seconds=1)
zones = {}


def wall(t, z):
    return datetime.fromtimestamp(t, z).replace(tzinfo=None)


def instant(w, z):
    """The instant a wall time fires at, by the rule."""
    u = int(w.replace(tzinfo=z, fold=0).timestamp())
    if wall(u, z) == w:
        return u  # it occurs; fold=0 is its first occurrence
    # It does not occur: the first instant whose wall time is past it (the change).
    lo, hi = u - 26 * 3600, u + 26 * 3600
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if wall(mid, z) > w:
            hi = mid
        else:
            lo = mid
    return hi


def rule_next(expr, z, t, seconds_first):
    # The latest wall time whose instant is at or before t, by bisection over wall times
    # (instants grow with wall times); croniter's next match after it is the answer.
    base = wall(t, z)
    lo, hi = base - timedelta(hours=3), base + timedelta(hours=3)
    while hi - lo > SECOND:
        mid = lo + (hi - lo) // 2
        mid = mid.replace(microsecond=0)
        if instant(mid, z) <= t:
            lo = mid
        else:
            hi = mid
    it = croniter(expr, lo, second_at_beginning=seconds_first)
    while True:
        w = it.get_next(datetime)
        at = instant(w, z)
        if at > t:
            return at


def raw_next(expr, z, t, seconds_first):
    start = datetime.fromtimestamp(t, z)
    return int(croniter(expr, start, second_at_beginning=seconds_first).get_next(datetime).timestamp())


def full_days(expr, seconds_first):
    """The expression with a day field that allows every day written as `*`."""
    fields = expr.split()
    dom, dow = (3, 5) if seconds_first else (2, 4)
    expanded, _ = croniter.expand(expr, second_at_beginning=seconds_first)
    # croniter.expand orders the fields minute, hour, day, month, weekday[, second].
    changed = False
    for i, values, every in ((dom, expanded[2], set(range(1, 32))), (dow, expanded[4], set(range(7)))):
        plain = {v % 7 if i == dow else v for v in values if isinstance(v, int)}
        if values != ["*"] and every <= plain:
            fields[i] = "*"
            changed = True
    return " ".join(fields), changed


def main():
    for line in sys.stdin:
        case = json.loads(line)
        z = zones.setdefault(case["zone"], ZoneInfo(case["zone"]))
        expr, t = case["expr"], case["t"]
        seconds_first = len(expr.split()) == 6
        out = {"rule": None, "raw": None, "raw_ruled": None, "full_day_field": False, "error": None}
        try:
            ruled, out["full_day_field"] = full_days(expr, seconds_first)
            out["rule"] = rule_next(ruled, z, t, seconds_first)
            out["raw"] = raw_next(expr, z, t, seconds_first)
            out["raw_ruled"] = raw_next(ruled, z, t, seconds_first)
        except Exception as e:  # croniter's refusals and "no match within 50 years"
            out["error"] = f"{type(e).__name__}: {e}"
        print(json.dumps(out), flush=False)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
