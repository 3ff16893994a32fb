"""docker-compose.yml and Dockerfile, checked by parsing (no Docker engine here): the services and
their health checks, secrets only from .env, mounts, GPU reservations, and one settings source with
the Celery stack of `make airflow AIRFLOW_STACK=celery` (deploy/airflow.env: executor, parallelism,
pools, connections), which scripts/airflow_local.sh really reads (tests/dags run that stack)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import yaml

ROOT = Path(__file__).resolve().parents[1]
COMPOSE_TEXT = (ROOT / "docker-compose.yml").read_text()
COMPOSE = yaml.safe_load(COMPOSE_TEXT)
SERVICES = COMPOSE["services"]
LOCAL_SCRIPT = (ROOT / "scripts/airflow_local.sh").read_text()
SETTINGS_PATH = "deploy/airflow.env"
AIRFLOW_SERVICES = {"airflow-apiserver": "api-server", "airflow-scheduler": "scheduler",
                    "airflow-dag-processor": "dag-processor", "airflow-triggerer": "triggerer",
                    "airflow-worker": "celery"}
LONG_RUNNING = ["postgres", "redis", *AIRFLOW_SERVICES]
PROJECT = "/opt/uniter"
SECRET = re.compile(r"PASSWORD|SECRET|FERNET|_KEY$")


def interpolation_default(value: str) -> str:
    """The default of a compose ``${VAR:-default}`` value (the value itself when it has none)."""
    m = re.fullmatch(r"\$\{\w+:-([^}]*)\}", str(value))
    return m.group(1) if m else str(value)


def volume_target_source(spec: str) -> tuple[str, str]:
    """``SOURCE:TARGET[:MODE]`` -> (target, source); SOURCE may be a ``${VAR:-default}``."""
    m = re.fullmatch(r"(\$\{[^}]*\}|[^:]+):([^:]+)(?::(?:ro|rw))?", spec)
    assert m, f"unparsed volume {spec!r}"
    return m.group(2), m.group(1)


def env_file_keys(path: str = ".env.example") -> dict[str, str]:
    pairs = [line.split("=", 1) for line in (ROOT / path).read_text().splitlines()
             if line.strip() and not line.startswith("#")]
    return {k.strip(): v.strip() for k, v in pairs}


def script_env(stack: str, tmp_path: Path) -> dict[str, str]:
    """What scripts/airflow_local.sh exports for a stack (its `env` command), with an environment
    that sets none of the settings' keys."""
    settings = env_file_keys(SETTINGS_PATH)
    env = {k: v for k, v in os.environ.items() if k not in settings and not k.startswith("AIRFLOW")}
    env.update(AIRFLOW_STACK=stack, AIRFLOW_HOME=str(tmp_path))
    out = subprocess.run(["bash", str(ROOT / "scripts/airflow_local.sh"), "env"], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines())


def test_services_of_the_design_exist_with_celery_optional():
    assert {"postgres", "airflow-init", *AIRFLOW_SERVICES} <= set(SERVICES)
    for name in LONG_RUNNING + ["airflow-init"]:
        assert "profiles" not in SERVICES[name], f"{name} must run without a profile: the stack is Celery's"
    for name, command in AIRFLOW_SERVICES.items():
        assert SERVICES[name]["command"][0] == command, name
        assert SERVICES[name]["image"] == SERVICES["airflow-init"]["image"], "one image for every Airflow service"
        assert SERVICES[name]["build"]["dockerfile"] == "Dockerfile"


def test_every_long_running_service_has_a_healthcheck_and_order_follows_health():
    for name in LONG_RUNNING:
        check = SERVICES[name].get("healthcheck")
        assert check and check["test"] and check["interval"] and check["retries"] >= 3, f"{name}: no healthcheck"
    for name in AIRFLOW_SERVICES:
        deps = SERVICES[name]["depends_on"]
        assert deps["postgres"]["condition"] == "service_healthy", name
        assert deps["redis"]["condition"] == "service_healthy", name
        assert deps["airflow-init"]["condition"] == "service_completed_successfully", name
    assert SERVICES["airflow-worker"]["depends_on"]["redis"]["condition"] == "service_healthy"
    assert SERVICES["airflow-init"]["restart"] == "no"


def test_secrets_come_only_from_env_and_env_example_lists_every_variable():
    used = set(re.findall(r"(?<!\$)\$\{(\w+)", COMPOSE_TEXT))  # $${X} is the container's own variable
    example = env_file_keys()
    assert used <= set(example), f".env.example lacks {sorted(used - set(example))}"
    for key, value in example.items():
        if SECRET.search(key):
            assert value == "", f".env.example must not carry a value for the secret {key}"
    for name, service in SERVICES.items():
        env = service.get("environment", {})
        for key, value in env.items():
            # a *_FILE key names where a secret lies (the login's passwords file), not the secret
            if (SECRET.search(key) and not key.endswith("_FILE")) or "SQL_ALCHEMY_CONN" in key or "BROKER_URL" in key:
                assert "${" in str(value), f"{name}.{key} holds a literal secret"
    assert re.search(r"^\.env$", (ROOT / ".gitignore").read_text(), re.M), ".env must be gitignored"


def test_project_data_and_runs_are_mounted_where_the_dag_folder_points():
    for name in AIRFLOW_SERVICES:
        service = SERVICES[name]
        targets = dict(volume_target_source(v) for v in service["volumes"])
        assert targets[PROJECT] == "."
        assert interpolation_default(targets[f"{PROJECT}/data"]) == "./data"
        assert interpolation_default(targets[f"{PROJECT}/runs"]) == "./runs"
        assert service["working_dir"] == PROJECT  # stages run from the project root, like DVC
        assert service["environment"]["AIRFLOW__CORE__DAGS_FOLDER"] == f"{PROJECT}/dags"


def test_one_settings_file_for_compose_and_the_local_celery_stack(tmp_path):
    """deploy/airflow.env: every Airflow service reads it, compose redefines none of its keys but the
    connections (own hosts, .env's passwords; same drivers and database), and the script exports
    exactly its values for the Celery stack (the local stack: LocalExecutor on SQLite instead)."""
    settings = env_file_keys(SETTINGS_PATH)
    assert settings["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    for key, value in settings.items():  # literal values: compose's env_file and the script read them alike
        assert not re.search(r"[\"'$\s#]", value), f"{SETTINGS_PATH}: {key} must be a literal value"
    connections = {"AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__CELERY__BROKER_URL", "AIRFLOW__CELERY__RESULT_BACKEND"}
    assert connections <= set(settings)
    for name in [*AIRFLOW_SERVICES, "airflow-init"]:
        service = SERVICES[name]
        assert service["env_file"] == [SETTINGS_PATH], name
        assert set(service["environment"]) & set(settings) <= connections, f"{name} redefines a setting"
        for key in connections:
            # compose's value with its defaults filled in and its required values as "x"
            resolved = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", service["environment"][key])
            theirs, ours = urlsplit(re.sub(r"\$\{[^}]*\}", "x", resolved)), urlsplit(settings[key])
            assert (ours.scheme, ours.path) == (theirs.scheme, theirs.path), key
    assert 'SETTINGS="$REPO/' + SETTINGS_PATH + '"' in LOCAL_SCRIPT
    celery = script_env("celery", tmp_path)
    assert {k: celery[k] for k in settings} == settings
    assert celery["AIRFLOW__CORE__DAGS_FOLDER"] == str(ROOT / "dags")  # . is mounted at /opt/uniter/dags
    local = script_env("local", tmp_path)
    assert local["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert local["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == f"sqlite:///{tmp_path}/airflow.db"
    assert local["AIRFLOW__CORE__PARALLELISM"] == settings["AIRFLOW__CORE__PARALLELISM"]
    init = " ".join(SERVICES["airflow-init"]["command"])  # the pool's slots: the container's variable, from the file
    assert 'pools set gpu "$${AIRFLOW_GPU_SLOTS}"' in init and "airflow db migrate" in init
    assert 'airflow pools set gpu "$GPU_SLOTS"' in LOCAL_SCRIPT and 'GPU_SLOTS="$AIRFLOW_GPU_SLOTS"' in LOCAL_SCRIPT


def test_the_services_that_run_tasks_reserve_gpus():
    devices = SERVICES["airflow-worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in d["capabilities"] and d["driver"] == "nvidia" for d in devices)
    assert "deploy" not in SERVICES["airflow-scheduler"], "the CeleryExecutor's scheduler runs no task"


def test_ui_is_published_on_localhost_only():
    for name, service in SERVICES.items():
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name} publishes {port} on every interface"


def test_dockerfile_builds_python_311_with_the_projects_setup():
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim", text, re.M)
    assert re.search(r"make setup VENV=(\S+)", text)
    venv = re.search(r"make setup VENV=(\S+)", text).group(1)
    assert f"PATH={venv}/bin" in text, "the image's PATH must find the venv that make setup built"
    assert f"WORKDIR {PROJECT}" in text
    assert not venv.startswith(PROJECT), "the venv must live outside the mounted project"
    requires = re.search(r'requires-python = "([^"]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    assert ">=3.11" in requires and "<3.12" in requires


def test_the_login_password_comes_from_env_into_the_file_the_api_server_reads(tmp_path):
    """The api-server's entrypoint writes .env's AIRFLOW_ADMIN_PASSWORD into the simple auth manager's
    passwords file (not generated into a container's $AIRFLOW_HOME), then runs ``airflow <command>``."""
    import importlib.util
    import json
    import subprocess
    import sys

    api = SERVICES["airflow-apiserver"]
    env = api["environment"]
    assert env["AIRFLOW_ADMIN_PASSWORD"].startswith("${AIRFLOW_ADMIN_PASSWORD:?"), "the password comes from .env"
    assert "AIRFLOW_ADMIN_PASSWORD" in env_file_keys()
    for name, service in SERVICES.items():  # only the service that serves the login holds the password
        assert name == "airflow-apiserver" or "AIRFLOW_ADMIN_PASSWORD" not in service.get("environment", {}), name
    spec = importlib.util.find_spec("airflow")  # the config key is Airflow's own (read without importing it)
    if spec is not None:
        template = Path(spec.submodule_search_locations[0]) / "config_templates/config.yml"
        assert "simple_auth_manager_passwords_file" in yaml.safe_load(template.read_text())["core"]["options"]

    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "airflow").write_text('#!/bin/sh\necho "airflow $*"\n')
    (fake_bin / "airflow").chmod(0o755)
    passwords = tmp_path / "simple_auth_manager_passwords.json"
    users = re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"])
    run_env = {"PATH": f"{fake_bin}:{Path(sys.executable).parent}:/usr/bin:/bin", "AIRFLOW_ADMIN_PASSWORD": "from-env",
               "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": users,
               "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords)}
    assert api["entrypoint"][:2] == ["/usr/bin/tini", "--"]
    script = [arg.replace("$$", "$") for arg in api["entrypoint"][2:]]  # compose reads $$ as a literal $
    out = subprocess.run([*script, *api["command"]], env=run_env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "airflow " + " ".join(api["command"])
    assert json.loads(passwords.read_text()) == {"admin": "from-env"}
    assert passwords.stat().st_mode & 0o077 == 0, "the passwords file is the owner's only"
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"].startswith("/opt/airflow/")  # the image's home
