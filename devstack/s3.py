"""An S3-compatible server for tests and local runs: ``moto_server`` as a subprocess.

(In-process moto makes delta-rs ``restore()`` and ``history()`` hang, so it runs apart.) It runs
through :mod:`devstack.s3_server`, which spares moto two costs per request that S3 does not
have (finding the service, walking the whole bucket on a list).

Example::

    with MotoS3(work_dir) as s3:
        s3.create_bucket("falkirk")
        store = StoreConfig("s3://falkirk/store", str(work_dir / "scratch"), s3.storage_options())
"""

from __future__ import annotations

from pathlib import Path

import boto3
import httpx

from devstack.processes import VENV_BIN, Service, free_port, wait_until

ROOT = Path(__file__).resolve().parents[1]

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_REGION": "us-east-1"}


class MotoS3:
    """``moto_server`` on 127.0.0.1 with fixed test credentials."""

    def __init__(self, work_dir: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.service = Service(
            "moto_server", [str(VENV_BIN / "python"), "-m", "devstack.s3_server", "-H", "127.0.0.1", "-p",
                            str(self.port)],
            env={"PATH": str(VENV_BIN)}, log_path=work_dir / "moto_server.log", cwd=ROOT,
        )

    def start(self) -> MotoS3:
        self.service.start()
        wait_until("moto_server", lambda: httpx.get(f"{self.endpoint}/moto-api/", timeout=2).status_code == 200,
                    timeout=30, services=[self.service])
        return self

    def stop(self) -> None:
        self.service.stop()

    def storage_options(self) -> dict[str, str]:
        """What delta-rs (and ``StoreConfig``) needs to reach this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ALLOW_HTTP": "true", **CREDENTIALS}

    def client(self):  # noqa: ANN201 (boto3 client types are generated)
        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name=CREDENTIALS["AWS_REGION"],
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )

    def create_bucket(self, name: str) -> None:
        self.client().create_bucket(Bucket=name)

    def __enter__(self) -> MotoS3:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
