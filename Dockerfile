# syntax=docker/dockerfile:1.7
# The uniter-pipeline image: Python 3.11 slim + the project's own `make setup` (pinned
# requirements, detectron2 via scripts/install_detectron2.sh, the project installed editable).
# docker-compose.yml runs Airflow from it with the project mounted at /opt/uniter.
#
# torch/torchvision are pinned to local wheels (requirements.txt): pass their folder as the
# `wheels` build context, e.g. `docker build --build-context wheels=/opt/wheels .` (compose does
# this from UNITER_WHEELS). An empty folder works where the index serves the pinned versions.
FROM python:3.11-slim

ARG AIRFLOW_UID=50000
ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_FIND_LINKS=/opt/wheels \
    DVC_NO_ANALYTICS=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    PYTHONHASHSEED=0 \
    AIRFLOW_HOME=/opt/airflow \
    TORCH_EXTENSIONS_DIR=/opt/airflow/torch_extensions \
    PATH=/opt/venv/bin:$PATH

RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential git make curl tini libgl1 libglib2.0-0 \
    && rm -rf /var/lib/apt/lists/* \
    && git config --system --add safe.directory /opt/uniter  # run records name the mounted commit

WORKDIR /opt/uniter
# Dependencies first, so code edits do not rebuild them. The venv lives outside /opt/uniter:
# compose mounts the project there, and the editable install then serves the mounted code.
COPY requirements.txt requirements-dev.txt pyproject.toml Makefile README.md ./
COPY scripts/ scripts/
COPY pipeline/ pipeline/
COPY model/ model/
RUN --mount=type=bind,from=wheels,target=/opt/wheels \
    --mount=type=cache,target=/root/.cache/pip \
    make setup VENV=/opt/venv \
    && /opt/venv/bin/pip install apache-airflow-providers-celery==3.26.0 psycopg2-binary==2.9.13

COPY . .
RUN useradd --uid "${AIRFLOW_UID}" --gid 0 --home-dir /opt/airflow --create-home airflow \
    && mkdir -p /opt/airflow/logs /opt/uniter/data /opt/uniter/runs \
    && chown -R "${AIRFLOW_UID}:0" /opt/airflow /opt/uniter/data /opt/uniter/runs
USER ${AIRFLOW_UID}

ENTRYPOINT ["/usr/bin/tini", "--", "airflow"]
CMD ["version"]
