from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .support import Sidecar


@pytest.fixture
def store(tmp_path: Path) -> str:
    """A SQLite store file of the test's own."""
    return f"sqlite:{tmp_path / 'leases.db'}"


@pytest.fixture
def sidecars(tmp_path: Path) -> Iterator[Callable[..., Sidecar]]:
    """Starts sidecars (`sidecars(store)`); all are killed at the end of the test."""
    started: list[Sidecar] = []

    def start(store: str, *extra: str) -> Sidecar:
        sidecar = Sidecar(store, tmp_path / f"sidecar-{len(started)}.log", extra)
        started.append(sidecar)
        return sidecar

    yield start
    for sidecar in started:
        sidecar.stop(9)
