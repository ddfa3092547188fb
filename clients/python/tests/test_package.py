"""The client as a package, used the way the READMEs say: the wheel built from the sources and
installed (with its extras) into a fresh virtualenv outside the repository; its types seen by
mypy --strict through `py.typed`; the client README's example and docs/clients.md's APScheduler
and Celery beat snippets run there as written, against real sidecars (time sped up: the
snippets' intervals become 1 s, as the TypeScript client's test speeds up setInterval)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import tomllib
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.replicas.harness import CLIENT_DIR
from tests.support import ROOT, Sidecar

VERSION = tomllib.loads((ROOT / "Cargo.toml").read_text())["workspace"]["package"]["version"]
REQUIREMENTS = CLIENT_DIR / "requirements-test.txt"
RUN_LINE = re.compile(r"expire-gigs: slot (\d+), token (\d+)")

# The tests' own lines, put before a snippet: APScheduler's intervals become 1 s.
APSCHEDULER_FAST = """\
import apscheduler.triggers.interval as _interval
_interval_init = _interval.IntervalTrigger.__init__
_interval.IntervalTrigger.__init__ = lambda self, *a, **kw: _interval_init(
    self, seconds=1, timezone=kw.get("timezone")
)
"""
# ... and Celery beat's.
CELERY_FAST = """\
import datetime as _datetime
import celery.schedules as _schedules
_schedule_init = _schedules.schedule.__init__
_schedules.schedule.__init__ = lambda self, run_every=None, *a, **kw: _schedule_init(
    self, _datetime.timedelta(seconds=1), *a, **kw
)
"""


def python_block(readme: Path, heading: str | None = None) -> str:
    """The first ```python block of `readme`, after `heading` if given."""
    text = readme.read_text()
    if heading is not None:
        text = text.split(f"\n{heading}\n", 1)[1]
    match = re.search(r"```python\n(.*?)```\n", text, re.DOTALL)
    assert match, f"a python block in {readme} after {heading}"
    return match.group(1)


class App:
    """The fresh virtualenv the wheel is installed in, and a directory outside the repository."""

    def __init__(self, root: Path, wheel: Path) -> None:
        self.root = root
        self.wheel = wheel
        self.bin = root / "venv" / "bin"
        self.dir = root / "app"
        self.dir.mkdir()

    def start(self, args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        environment = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        with log.open("ab") as out:
            return subprocess.Popen(
                args,
                cwd=self.dir,
                env={**environment, **env},
                stdout=out,
                stderr=subprocess.STDOUT,
            )


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> App:
    root = tmp_path_factory.mktemp("package")
    dist = root / "dist"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    # The sources as they are, built by the project's own backend (hatchling).
    subprocess.run(
        [*pip, "wheel", "--quiet", "--no-deps", "--no-build-isolation", "-w", dist, CLIENT_DIR],
        check=True,
    )
    [wheel] = dist.iterdir()
    subprocess.run([sys.executable, "-m", "venv", root / "venv"], check=True)
    installed = App(root, wheel)
    subprocess.run(
        [installed.bin / "pip", "install", "--quiet", "--disable-pip-version-check",
         "--no-input", "-c", REQUIREMENTS, f"{wheel}[apscheduler,celery]", "celery[redis]"],
        check=True,
    )  # fmt: skip
    return installed


@pytest.fixture
def sidecars(tmp_path: Path) -> Iterator[Callable[..., Sidecar]]:
    started: list[Sidecar] = []

    def start(store: str) -> Sidecar:
        sidecar = Sidecar(store, tmp_path / f"sidecar-{len(started)}.log")
        started.append(sidecar)
        return sidecar

    yield start
    for sidecar in started:
        sidecar.stop(signal.SIGKILL)


def test_the_wheel_carries_the_typed_package(app: App) -> None:
    assert app.wheel.name == f"leasehold_client-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(app.wheel) as wheel:
        names = set(wheel.namelist())
        metadata = wheel.read(f"leasehold_client-{VERSION}.dist-info/METADATA").decode()
    for module in ("__init__.py", "py.typed", "apscheduler.py", "celery.py", "_sync.py"):
        assert f"leasehold_client/{module}" in names
    assert not any(name.startswith("tests/") for name in names)
    assert "\nName: leasehold-client\n" in metadata
    assert f"\nVersion: {VERSION}\n" in metadata
    assert "Requires-Dist: httpx" in metadata
    assert "Provides-Extra: apscheduler" in metadata
    assert "Provides-Extra: celery" in metadata
    # Installed outside the repository, it imports from the virtualenv, not from the sources.
    where = subprocess.run(
        [
            app.bin / "python",
            "-c",
            "import leasehold_client as c; print(c.__version__, c.__file__)",
        ],
        cwd=app.dir,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert where[0] == VERSION
    assert where[1].startswith(str(app.root / "venv"))


def test_mypy_strict_sees_the_installed_types(app: App) -> None:
    def mypy(code: str) -> subprocess.CompletedProcess[str]:
        (app.dir / "user.py").write_text(code)
        return subprocess.run(
            [sys.executable, "-m", "mypy", "--strict", "--no-incremental",
             "--python-executable", app.bin / "python", "user.py"],
            cwd=app.dir, capture_output=True, text=True,
        )  # fmt: skip

    good = mypy(
        "from leasehold_client import Client, Run, Skipped\n"
        "def sweep(client: Client) -> int | None:\n"
        "    run = client.tick('sweep', every=30, tz='UTC')\n"
        "    if isinstance(run, Skipped):\n"
        "        return None\n"
        "    with run:\n"
        "        return run.slot\n"
    )
    assert good.returncode == 0, good.stdout
    bad = mypy(
        "from leasehold_client import Client\n"
        "def sweep(client: Client) -> None:\n"
        "    client.tick('sweep', every='30s')\n"
    )
    assert bad.returncode == 1, bad.stdout
    assert 'Argument "every" to "tick" of "Client" has incompatible type "str"' in bad.stdout


def test_the_client_readme_example_runs_as_written(
    app: App, sidecars: Callable[..., Sidecar], tmp_path: Path
) -> None:
    sidecar = sidecars(f"sqlite:{tmp_path / 'leases.db'}")
    (app.dir / "example.py").write_text(python_block(CLIENT_DIR / "README.md"))
    run = subprocess.run(
        [app.bin / "python", "example.py"],
        cwd=app.dir,
        env={**os.environ, "LEASEHOLD_SIDECAR": sidecar.url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert re.fullmatch(r"reindex: batch 2 with token \d+", lines[2]), lines
    assert RUN_LINE.fullmatch(lines[3]), lines
    assert lines[4] == "ran"
    assert re.fullmatch(r"rebuild: done with token \d+", lines[5]), lines


def runs_in(text: str) -> list[int]:
    return [int(m.group(1)) for m in RUN_LINE.finditer(text)]


def test_the_apscheduler_snippet_runs_as_written(
    app: App, sidecars: Callable[..., Sidecar], tmp_path: Path
) -> None:
    snippet = python_block(ROOT / "docs" / "clients.md", "## Python: APScheduler")
    (app.dir / "sweeps.py").write_text(APSCHEDULER_FAST + snippet)
    store = f"sqlite:{tmp_path / 'leases.db'}"
    replicas = []
    for name in ("a", "b"):
        sidecar = sidecars(store)
        log = tmp_path / f"{name}.log"
        env = {"LEASEHOLD_SIDECAR": sidecar.url}
        replicas.append((app.start([str(app.bin / "python"), "sweeps.py"], env, log), log))
    time.sleep(5)
    for process, _ in replicas:
        process.send_signal(signal.SIGTERM)
    outputs = []
    for process, log in replicas:
        assert process.wait(timeout=30) == 0, log.read_text()
        outputs.append(log.read_text())
    slots = [slot for output in outputs for slot in runs_in(output)]
    assert len(slots) == len(set(slots)), f"a slot ran twice: {outputs}"
    assert len(slots) >= 3, outputs


def test_the_celery_snippet_runs_as_written(
    app: App, sidecars: Callable[..., Sidecar], tmp_path: Path
) -> None:
    snippet = python_block(ROOT / "docs" / "clients.md", "## Python: Celery beat")
    (app.dir / "tasks.py").write_text(CELERY_FAST + snippet)
    base = os.environ.get("LEASEHOLD_TEST_REDIS_URL", "redis://127.0.0.1:6379").rstrip("/")
    # Celery takes the broker from the environment first: the test's own database.
    env = {"CELERY_BROKER_URL": f"{base}/12"}
    celery = str(app.bin / "celery")
    purge = app.start([celery, "-A", "tasks", "purge", "-f"], env, tmp_path / "purge.log")
    assert purge.wait(timeout=60) == 0, (tmp_path / "purge.log").read_text()
    worker_log = tmp_path / "worker.log"
    worker = app.start([celery, "-A", "tasks", "worker", "--pool=solo"], env, worker_log)
    store = f"sqlite:{tmp_path / 'leases.db'}"
    beats = []
    try:
        for name in ("a", "b"):
            sidecar = sidecars(store)
            beat_env = {**env, "LEASEHOLD_SIDECAR": sidecar.url}
            args = [celery, "-A", "tasks", "beat", "-s", str(tmp_path / f"{name}-schedule")]
            beats.append(app.start(args, beat_env, tmp_path / f"beat-{name}.log"))
        time.sleep(8)
    finally:
        for process in [*beats, worker]:
            process.send_signal(signal.SIGTERM)
        for process in [*beats, worker]:
            process.wait(timeout=30)
    slots = runs_in(worker_log.read_text())
    assert len(slots) == len(set(slots)), f"a slot ran twice: {slots}"
    assert len(slots) >= 3, worker_log.read_text()
