#!/usr/bin/env bash
# A local Airflow 3 for the uniter_pretraining DAG, everything bound to 127.0.0.1, state under
# $AIRFLOW_HOME (default: <repo>/airflow_home, gitignored). Two stacks (AIRFLOW_STACK):
#   local  (default) SQLite + LocalExecutor: the scheduler runs the tasks
#   celery           PostgreSQL + CeleryExecutor + Redis broker, as docker-compose.yml: this machine's
#                    services on 127.0.0.1 (database created if missing) and AIRFLOW_CELERY_WORKERS
#                    Celery workers (2), named worker<i>@<host> (task instances record that name)
# Settings (executor, parallelism, pools, connections): deploy/airflow.env, which docker-compose.yml
# reads too; a variable set in the environment wins over the file.
#
#   scripts/airflow_local.sh start            # db migrate, `gpu` pool, api-server + scheduler + dag-processor (+ workers)
#   scripts/airflow_local.sh trigger '{...}' [RUN_ID]  # trigger uniter_pretraining with a conf; prints the run id:
#                                             # RUN_ID, else the conf's run_name, else manual__<UTC time>
#   scripts/airflow_local.sh trigger deploy/airflow/tiny.json [RUN_ID]  # the same with a conf file
#   scripts/airflow_local.sh wait RUN_ID [S]  # wait until the run succeeds (exit 0) or fails (exit 1)
#   scripts/airflow_local.sh status           # which processes run, the last runs
#   scripts/airflow_local.sh stop             # stop what `start` started
#   scripts/airflow_local.sh kill-worker N    # SIGKILL every process of Celery worker N (a lost host)
#
# Environment: AIRFLOW_STACK (local | celery; later commands default to the one `start` used),
# AIRFLOW_HOME, AIRFLOW_PORT (8080), AIRFLOW_GPU_SLOTS (deploy/airflow.env), AIRFLOW_CELERY_WORKERS (2),
# AIRFLOW_START_TIMEOUT (180 s for the DAG to be parsed), AIRFLOW_LOCAL_DRY_RUN=1 (`trigger` prints
# the airflow command to stderr and the run id, and triggers nothing).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SETTINGS="$REPO/deploy/airflow.env"
DAG_ID=uniter_pretraining
export AIRFLOW_HOME="${AIRFLOW_HOME:-$REPO/airflow_home}"
PORT="${AIRFLOW_PORT:-8080}"
START_TIMEOUT="${AIRFLOW_START_TIMEOUT:-180}"
PIDS="$AIRFLOW_HOME/pids"
LOGS="$AIRFLOW_HOME/logs"

mkdir -p "$AIRFLOW_HOME" "$PIDS" "$LOGS"
STACK="${AIRFLOW_STACK:-$(cat "$AIRFLOW_HOME/stack" 2>/dev/null || echo local)}"
case "$STACK" in local|celery) ;; *) echo "AIRFLOW_STACK=$STACK: expected local or celery" >&2; exit 2 ;; esac
WORKERS="${AIRFLOW_CELERY_WORKERS:-2}"
PROCS=(api-server scheduler dag-processor)
if [[ "$STACK" == celery ]]; then for i in $(seq 1 "$WORKERS"); do PROCS+=("worker$i"); done; fi

# deploy/airflow.env: KEY=VALUE lines, exported unless the environment sets the key already
while IFS= read -r line; do
  [[ "$line" =~ ^([A-Za-z_][A-Za-z0-9_]*)=(.*)$ ]] || continue
  [[ -n "${!BASH_REMATCH[1]+set}" ]] || export "${BASH_REMATCH[1]}=${BASH_REMATCH[2]}"
done < "$SETTINGS"
GPU_SLOTS="$AIRFLOW_GPU_SLOTS"
# the venv's bin first: tasks run `python -m pipeline ...` and the executor starts `airflow` itself
if [[ -x "$REPO/.venv/bin/airflow" ]]; then export PATH="$REPO/.venv/bin:$PATH"; fi

# One JWT secret shared by the api-server and the task processes, kept out of the repo.
if [[ ! -s "$AIRFLOW_HOME/jwt_secret" ]]; then
  (umask 077 && python -c 'import secrets; print(secrets.token_urlsafe(48))' > "$AIRFLOW_HOME/jwt_secret")
fi
export AIRFLOW__API_AUTH__JWT_SECRET="$(cat "$AIRFLOW_HOME/jwt_secret")"
export AIRFLOW__CORE__DAGS_FOLDER="$REPO/dags"
if [[ "$STACK" == local ]]; then  # the embedded stack: no services needed
  export AIRFLOW__CORE__EXECUTOR=LocalExecutor
  export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN="sqlite:///$AIRFLOW_HOME/airflow.db"
fi
export AIRFLOW__API__HOST=127.0.0.1
export AIRFLOW__API__PORT="$PORT"
export AIRFLOW__API__BASE_URL="http://127.0.0.1:$PORT"
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="http://127.0.0.1:$PORT/execution/"
# local only (bound to 127.0.0.1): no login for the UI
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS=True
export AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK=False
export DVC_NO_ANALYTICS=1 DS_ACCELERATOR="${DS_ACCELERATOR:-cpu}" HF_HUB_OFFLINE=1 PYTHONHASHSEED=0
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$REPO/.cache/torch_extensions}"

running() { [[ -s "$PIDS/$1.pid" ]] && kill -0 "$(cat "$PIDS/$1.pid")" 2>/dev/null; }

start_proc() {
  local name="$1"; shift
  if running "$name"; then echo "$name already running (pid $(cat "$PIDS/$name.pid"))"; return; fi
  # its own session, so `stop` ends the whole process group (gunicorn/uvicorn and executor workers)
  setsid airflow "$@" >>"$LOGS/$name.log" 2>&1 < /dev/null &
  echo $! > "$PIDS/$name.pid"
  echo "started $name (pid $!, log $LOGS/$name.log)"
}

# The Celery stack's services: the broker answers, the metadata database exists (created if not).
# Exits 3 naming the service that is missing.
check_services() {
  python - <<'PY' || exit 3
import os, socket, sys
from urllib.parse import urlsplit
broker = urlsplit(os.environ["AIRFLOW__CELERY__BROKER_URL"])
try:
    with socket.create_connection((broker.hostname, broker.port or 6379), timeout=5) as s:
        s.sendall(b"PING\r\n")
        if not s.recv(64).startswith((b"+PONG", b"-NOAUTH")):
            raise OSError("no PONG")
except OSError as err:
    sys.exit(f"Redis (the Celery broker) not reachable at {broker.hostname}:{broker.port}: {err}")
import psycopg2
db = urlsplit(os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"])
name = db.path.lstrip("/")
try:
    conn = psycopg2.connect(host=db.hostname, port=db.port or 5432, user=db.username, password=db.password,
                            dbname="postgres", connect_timeout=5)
except psycopg2.OperationalError as err:
    sys.exit(f"PostgreSQL not reachable at {db.hostname}:{db.port}: {err}")
conn.autocommit = True
with conn.cursor() as cur:
    cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
    if cur.fetchone() is None:
        cur.execute(f'CREATE DATABASE "{name}"')
        print(f"created PostgreSQL database {name}")
conn.close()
PY
}

start_workers() {
  local i host
  host="$(hostname)"
  for i in $(seq 1 "$WORKERS"); do
    # the task processes report the worker's name as their hostname (pipeline.common.gpu_alloc.worker_host)
    UNITER_WORKER_NAME="worker$i@$host" AIRFLOW__CORE__HOSTNAME_CALLABLE=pipeline.common.gpu_alloc.worker_host \
      start_proc "worker$i" celery worker -H "worker$i@$host" --skip-serve-logs \
      -c "$AIRFLOW__CELERY__WORKER_CONCURRENCY"
  done
}

cmd_start() {
  cd "$REPO"
  echo "$STACK" > "$AIRFLOW_HOME/stack"
  if [[ "$STACK" == celery ]]; then check_services; fi
  airflow db migrate >>"$LOGS/db-migrate.log" 2>&1
  airflow pools set gpu "$GPU_SLOTS" "extraction and training tasks (one per accelerator)" >/dev/null
  start_proc api-server api-server -H 127.0.0.1 -p "$PORT"
  start_proc scheduler scheduler --skip-serve-logs
  start_proc dag-processor dag-processor
  if [[ "$STACK" == celery ]]; then start_workers; fi
  local deadline=$((SECONDS + START_TIMEOUT))
  # new DAGs start paused: wait until the dag-processor has stored it, then unpause it
  until airflow dags list -o plain 2>/dev/null | grep -qw "$DAG_ID"; do
    for p in "${PROCS[@]}"; do
      running "$p" || { echo "$p exited; see $LOGS/$p.log" >&2; tail -20 "$LOGS/$p.log" >&2; exit 1; }
    done
    (( SECONDS < deadline )) || { echo "$DAG_ID was not parsed within ${START_TIMEOUT}s" >&2; exit 1; }
    sleep 3
  done
  airflow dags unpause "$DAG_ID" >/dev/null
  until python -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$PORT/api/v2/monitor/health', timeout=3)" 2>/dev/null; do
    (( SECONDS < deadline )) || { echo "api-server not healthy within ${START_TIMEOUT}s" >&2; exit 1; }
    sleep 2
  done
  echo "Airflow is up ($STACK stack, $AIRFLOW__CORE__EXECUTOR): http://127.0.0.1:$PORT ($DAG_ID unpaused, AIRFLOW_HOME=$AIRFLOW_HOME)"
}

# Every process of a session that start_proc began (its leader's pid is the session id): Airflow
# puts each task into a process group of its own, so a group signal would miss the tasks.
session_pids() { ps -eo pid=,sid= | awk -v sid="$1" '$2 == sid { print $1 }'; }

kill_session() {
  local pid
  for pid in $(session_pids "$1"); do kill "-$2" "$pid" 2>/dev/null || true; done
}

cmd_stop() {
  local name pid names=() pids=()
  for pid_file in "$PIDS"/*.pid; do  # whatever `start` started, of either stack
    [[ -e "$pid_file" ]] || continue
    name="$(basename "$pid_file" .pid)"
    if running "$name"; then
      pid="$(cat "$PIDS/$name.pid")"
      kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
      names+=("$name"); pids+=("$pid")
    else
      rm -f "$pid_file"
    fi
  done
  # every process was asked at once, so their shutdowns overlap: wait for them together, 30 s at
  # most, then end whatever is left of each session (running tasks included)
  local deadline=$((SECONDS + 30)) alive
  while (( SECONDS < deadline )); do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    (( alive )) || break
    sleep 0.2
  done
  local i
  for i in "${!pids[@]}"; do
    kill_session "${pids[$i]}" KILL
    echo "stopped ${names[$i]}"
    rm -f "$PIDS/${names[$i]}.pid"
  done
}

# The run id for a trigger CONF (JSON): its run_name when it has one, so that `wait <run_name>`
# (as the docs say) finds the run; else manual__<UTC time>. Exits 2 when CONF is not a JSON object.
run_id_for() {
  python - "$1" <<'PY' || exit 2
import json, sys
try:
    conf = json.loads(sys.argv[1])
except ValueError as err:
    sys.exit(f"trigger: CONF is not JSON ({err}): {sys.argv[1]}")
if not isinstance(conf, dict):
    sys.exit(f"trigger: CONF must be a JSON object, got {sys.argv[1]}")
name = conf.get("run_name")
print(name if isinstance(name, str) and name else "")
PY
}

cmd_trigger() {
  local conf="${1:-}" run_id
  [[ -n "$conf" ]] || conf='{}'
  # a path to a conf file (deploy/airflow/*.json) instead of the JSON itself
  if [[ "$conf" != "{"* && -f "$conf" ]]; then conf="$(cat "$conf")"; fi
  run_id="${2:-$(run_id_for "$conf")}"
  run_id="${run_id:-manual__$(date -u +%Y%m%dT%H%M%S)}"
  local cmd=(airflow dags trigger "$DAG_ID" --conf "$conf" --run-id "$run_id")
  if [[ -n "${AIRFLOW_LOCAL_DRY_RUN:-}" ]]; then
    echo "would run: ${cmd[*]}" >&2
  elif ! "${cmd[@]}" >/dev/null; then
    # one Airflow run per id: a run_name triggered again (a retry of the same run) needs its own id
    echo "trigger failed (above): a conf the DAG's params refuse, or run $run_id exists already" \
      "(give a new id: $0 trigger CONF RUN_ID)" >&2
    exit 1
  fi
  echo "$run_id"
}

run_state() {
  # Read the run's state straight from the metadata DB (SQLite or PostgreSQL): each `airflow` CLI
  # call costs seconds of CPU that the running tasks need.
  local conn="$AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"
  if [[ "$conn" == sqlite:///* ]]; then
    python - "${conn#sqlite:///}" "$DAG_ID" "$1" <<'PY'
import sqlite3, sys
with sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True, timeout=30) as db:
    row = db.execute("SELECT state FROM dag_run WHERE dag_id = ? AND run_id = ?", sys.argv[2:4]).fetchone()
print(row[0] if row and row[0] else "unknown")
PY
    return
  fi
  python - "$conn" "$DAG_ID" "$1" <<'PY'
import sys
from urllib.parse import urlsplit
import psycopg2
db = urlsplit(sys.argv[1])
with psycopg2.connect(host=db.hostname, port=db.port or 5432, user=db.username, password=db.password,
                      dbname=db.path.lstrip("/"), connect_timeout=10) as conn, conn.cursor() as cur:
    cur.execute("SELECT state FROM dag_run WHERE dag_id = %s AND run_id = %s", sys.argv[2:4])
    row = cur.fetchone()
print(row[0] if row and row[0] else "unknown")
PY
}

cmd_wait() {
  local run_id="$1" timeout="${2:-3600}" deadline state
  deadline=$((SECONDS + timeout))
  while (( SECONDS < deadline )); do
    state="$(run_state "$run_id")"
    case "$state" in
      success) echo "$run_id: success"; return 0 ;;
      failed) echo "$run_id: failed (task logs under $LOGS)" >&2; return 1 ;;
    esac
    sleep 3
  done
  echo "$run_id: still $state after ${timeout}s" >&2
  return 1
}

cmd_kill_worker() {
  local name="worker${1:?usage: kill-worker N}"
  running "$name" || { echo "$name is not running" >&2; exit 1; }
  kill_session "$(cat "$PIDS/$name.pid")" KILL
  rm -f "$PIDS/$name.pid"
  echo "killed $name (SIGKILL to every process of its session: the worker, its tasks, their stages)"
}

cmd_status() {
  for name in "${PROCS[@]}"; do
    if running "$name"; then echo "$name: running (pid $(cat "$PIDS/$name.pid"))"; else echo "$name: stopped"; fi
  done
  airflow dags list-runs "$DAG_ID" 2>/dev/null | tail -n 5 || true
}

case "${1:-}" in
  start) cmd_start ;;
  stop) cmd_stop ;;
  trigger) shift; cmd_trigger "$@" ;;
  wait) shift; cmd_wait "$@" ;;
  status) cmd_status ;;
  kill-worker) shift; cmd_kill_worker "$@" ;;
  env) env | grep -E '^(AIRFLOW|PATH=)' | sort ;;
  *) echo "usage: $0 start|stop|trigger [CONF|CONF_FILE [RUN_ID]]|wait RUN_ID [TIMEOUT_S]|status|kill-worker N|env" >&2; exit 2 ;;
esac
