"""Helpers of the scheduler-driven Airflow runs (test_airflow_scheduler.py): a stack of a
checkout's scripts/airflow_local.sh started exactly as `make airflow [AIRFLOW_STACK=celery]` starts
it there, the services the Celery stack needs, and what Airflow recorded about a run's task instances."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import yaml

REPO = Path(__file__).resolve().parents[2]
SCRIPT = "scripts/airflow_local.sh"  # relative to the checkout a stack is deployed from
SETTINGS = REPO / "deploy/airflow.env"
DAG_ID = "uniter_pretraining"


def settings() -> dict[str, str]:
    """deploy/airflow.env as the script reads it (KEY=VALUE lines)."""
    pairs = [line.split("=", 1) for line in SETTINGS.read_text().splitlines()
             if line.strip() and not line.lstrip().startswith("#")]
    return {k: v for k, v in pairs}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def missing_service() -> str | None:
    """Why the Celery stack cannot run here (the service and its address), or None."""
    conf = settings()
    broker = urlsplit(conf["AIRFLOW__CELERY__BROKER_URL"])
    try:
        with socket.create_connection((broker.hostname, broker.port), timeout=3) as s:
            s.sendall(b"PING\r\n")
            if not s.recv(16).startswith(b"+PONG"):
                return f"Redis at {broker.hostname}:{broker.port} did not answer PING"
    except OSError as err:
        return f"Redis (Celery broker) not reachable at {broker.hostname}:{broker.port}: {err}"
    db = urlsplit(conf["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
    try:
        import psycopg2
    except ImportError:
        return "psycopg2 (PostgreSQL driver) not installed"
    try:
        psycopg2.connect(host=db.hostname, port=db.port, user=db.username, dbname="postgres", connect_timeout=3).close()
    except psycopg2.OperationalError as err:
        return f"PostgreSQL not reachable at {db.hostname}:{db.port}: {err}".strip()
    return None


def _pg(url: str, dbname: str | None = None):
    import psycopg2

    db = urlsplit(url.replace("db+", "", 1))
    conn = psycopg2.connect(host=db.hostname, port=db.port, user=db.username, password=db.password,
                            dbname=dbname or db.path.lstrip("/"), connect_timeout=10)
    conn.autocommit = True
    return conn


@dataclass
class Stack:
    """One started stack: the checkout it runs (its DAG folder, its stages' working directory), its
    environment (as the script gets it) and where it keeps its state."""

    name: str
    repo: Path
    env: dict[str, str]
    home: Path
    runs_dir: Path
    killed: list[dict] = field(default_factory=list)

    def script(self, *args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(self.repo / SCRIPT), *args], env=self.env, cwd=self.repo,
                              capture_output=True, text=True, check=check, timeout=timeout)

    @property
    def database(self) -> str | None:
        conn = self.env.get("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "")
        return urlsplit(conn).path.lstrip("/") if conn.startswith("postgresql") else None

    def task_instances(self, run_id: str) -> list[dict]:
        """Every try of every task instance of a run (Airflow's task_instance and its history)."""
        cols = "task_id, map_index, try_number, state, hostname, pid, start_date, end_date"
        query = (f"SELECT {cols} FROM task_instance WHERE dag_id = %s AND run_id = %s "
                 f"UNION ALL SELECT {cols} FROM task_instance_history WHERE dag_id = %s AND run_id = %s")
        with _pg(self.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]) as conn, conn.cursor() as cur:
            cur.execute(query, (DAG_ID, run_id, DAG_ID, run_id))
            names = [c.name for c in cur.description]
            return [dict(zip(names, row)) for row in cur.fetchall()]


def make_stack(name: str, base: Path, repo: Path, env: dict[str, str], **extra: str) -> Stack:
    """A stack deployed from the checkout ``repo``, its state in ``base/<name>_home``. Runs live where
    the checkout's params.yaml puts them (``paths.runs``, relative: inside the checkout), so two
    checkouts' runs of one conf record the same paths."""
    from pipeline.params.parser import RUNS_DIR_ENV

    home = base / f"{name}_home"
    env = {k: v for k, v in env.items() if k != RUNS_DIR_ENV}
    env.update({"AIRFLOW_STACK": name, "AIRFLOW_HOME": str(home), "AIRFLOW_PORT": str(free_port()),
                "AIRFLOW_START_TIMEOUT": "300", **extra})
    if name == "celery":
        # its own metadata database and queue: a developer's `make airflow` stack may share the services
        tag = f"test_{os.getpid()}_{secrets.token_hex(3)}"
        conf = settings()
        env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = conf["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] + f"_{tag}"
        env["AIRFLOW__CELERY__RESULT_BACKEND"] = conf["AIRFLOW__CELERY__RESULT_BACKEND"] + f"_{tag}"
        env["AIRFLOW__OPERATORS__DEFAULT_QUEUE"] = f"uniter_{tag}"
    runs = yaml.safe_load((repo / "params.yaml").read_text())["paths"]["runs"]
    return Stack(name=name, repo=repo, env=env, home=home, runs_dir=repo / runs)


def drop_database(stack: Stack) -> None:
    if stack.database:
        conn = _pg(stack.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], dbname="postgres")
        try:  # not `with conn`: psycopg2 opens a transaction there, and DROP DATABASE refuses one
            with conn.cursor() as cur:
                cur.execute(f'DROP DATABASE IF EXISTS "{stack.database}" WITH (FORCE)')
        finally:
            conn.close()


def _holding(stack: Stack, host: str, task_id: str) -> bool:
    """Whether a task of ``host`` holds GPUs for ``task_id`` now (pipeline.common.gpu_alloc's record)."""
    from pipeline.common import gpu_alloc

    record = stack.home / "gpu_locks" / gpu_alloc.RECORD_FILE
    return record.exists() and any(iv.end is None and iv.host == host and f":{task_id}@" in iv.label
                                   for iv in gpu_alloc.read_intervals(record))


def kill_worker_during(stack: Stack, run_id: str, task_id: str, *, settle_s: float, timeout_s: float) -> dict:
    """Wait until a mapped ``task_id`` instance of the run is running and holds its GPUs (its stage
    has started), let it work ``settle_s`` seconds, then SIGKILL every process of the worker that
    runs it. Returns what was killed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        running = [ti for ti in stack.task_instances(run_id)
                   if ti["task_id"] == task_id and ti["map_index"] >= 0 and ti["state"] == "running" and ti["hostname"]]
        if running and _holding(stack, running[0]["hostname"], task_id):
            ti = running[0]
            time.sleep(settle_s)
            worker = ti["hostname"].split("@")[0]  # worker<i>@<host>
            out = stack.script("kill-worker", worker.removeprefix("worker"))
            killed = {**ti, "worker": worker, "killed_at": time.time(), "message": out.stdout.strip()}
            stack.killed.append(killed)
            return killed
        time.sleep(1)
    raise AssertionError(f"no mapped {task_id} of {run_id} ran within {timeout_s:.0f} s")


def task_log(home: Path, run_id: str, task_id: str) -> str:
    """The text of every attempt of a task's log (Airflow 3 writes JSON lines)."""
    events = []
    for path in sorted((home / "logs" / f"dag_id={DAG_ID}" / f"run_id={run_id}" / f"task_id={task_id}").glob(
            "**/attempt=*.log")):
        for line in path.read_text().splitlines():
            try:
                events.append(str(json.loads(line).get("event", "")))
            except json.JSONDecodeError:
                events.append(line)
    return "\n".join(events)


def wait_for_retry(stack: Stack, run_id: str, killed: dict, *, timeout_s: float) -> dict:
    """Wait until the killed task instance runs again (a later try); returns that try's record."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for ti in stack.task_instances(run_id):
            if (ti["task_id"], ti["map_index"]) == (killed["task_id"], killed["map_index"]) \
                    and ti["try_number"] > killed["try_number"] and ti["state"] in ("running", "success"):
                return ti
        time.sleep(2)
    raise AssertionError(f"{killed['task_id']}[{killed['map_index']}] was not retried within {timeout_s:.0f} s")
