"""The ledger the replicas write: a JSON line when a sweep starts and another when it ends."""

from __future__ import annotations

import json
import os
import time
from typing import Any


def write(path: str, **line: Any) -> None:
    """Appends one line in one write (O_APPEND): lines of several processes never interleave."""
    data = (json.dumps({**line, "at": time.time()}) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def read(path: str) -> list[dict[str, Any]]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
