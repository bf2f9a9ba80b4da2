"""(f) docker-compose.yml validates (Debian's docker-compose parses and resolves it) and
declares the multi-machine shape: Postgres-backed Airflow, Spark master and worker, MinIO."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_compose_file_validates_and_declares_the_services() -> None:
    docker_compose = shutil.which("docker-compose")
    assert docker_compose, "docker-compose is missing: `make test` installs it (Debian package docker-compose)"
    proc = subprocess.run([docker_compose, "-f", str(ROOT / "docker-compose.yml"), "config"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    services = yaml.safe_load(proc.stdout)["services"]
    assert {"postgres", "postgres-create-queries", "redis", "minio", "minio-create-bucket", "airflow-init",
            "airflow-api-server", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer",
            "airflow-worker-a", "airflow-worker-b", "spark-master", "spark-worker-1", "spark-worker-2"} <= set(services)
    for name in ("airflow-api-server", "airflow-scheduler", "airflow-dag-processor", "airflow-triggerer"):
        env = services[name]["environment"]
        assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"].startswith("postgresql")
        assert env["FALKIRK_STORE_URI"] == "s3://falkirk/store"
        assert env["AWS_ENDPOINT_URL"] == "http://minio:9000"
        assert "spark://spark-master:7077" in env["AIRFLOW_CONN_SPARK_DEFAULT"]
        # No fixed token-signing secret: airflow-init generates one into the secrets volume.
        assert "AIRFLOW__API_AUTH__JWT_SECRET" not in env
        assert env["AIRFLOW__API_AUTH__JWT_SECRET_CMD"] == "cat /run/falkirk/jwt_secret"
        assert any(str(v).endswith(":/opt/falkirk:rw") or "/opt/falkirk" in str(v) for v in services[name]["volumes"])
    assert "secrets.token_urlsafe" in str(services["airflow-init"]["entrypoint"])
    assert "mc mb --ignore-existing local/falkirk" in str(services["minio-create-bucket"]["entrypoint"])
    for n in (1, 2):
        assert "spark://spark-master:7077" in " ".join(services[f"spark-worker-{n}"]["command"])
    # The Celery shape: every Airflow component on the broker, each worker its own name, queue and
    # scratch volume (its local disk), and the query statistics in PostgreSQL.
    for name in ("airflow-api-server", "airflow-scheduler", "airflow-worker-a", "airflow-worker-b"):
        env = services[name]["environment"]
        assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor" and env["AIRFLOW__CELERY__BROKER_URL"] == "redis://redis:6379/0"
        assert env["FALKIRK_WORKERS"] == "worker-a,worker-b"
        assert env["FALKIRK_QUERY_DB"] == "postgresql://airflow:airflow@postgres:5432/queries"
        assert env["AIRFLOW__CORE__HOSTNAME_CALLABLE"] == "falkirk.policies.workers.worker_name"
    scratch = {}
    for worker in ("worker-a", "worker-b"):
        service = services[f"airflow-{worker}"]
        assert service["environment"]["FALKIRK_WORKER"] == worker
        assert f"--queues default,{worker}" in " ".join(service["command"])
        scratch[worker] = {v.split(":")[0] for v in service["volumes"] if ":/var/lib/falkirk-scratch" in v}
    assert scratch == {"worker-a": {"scratch-a"}, "worker-b": {"scratch-b"}}  # no disk shared
    assert not any(":/var/lib/falkirk-scratch" in v for v in services["airflow-scheduler"]["volumes"])
    assert "CREATE DATABASE queries" in str(services["postgres-create-queries"]["entrypoint"])
