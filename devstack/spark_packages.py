"""Spark's JVM packages, as the Spark servers devstack starts load them.

``make install`` fetches them from Maven Central (``jvm/pom.xml``: Delta for Spark 4.2 with
delta-storage, Hadoop's S3A file system and the AWS SDK modules it calls) into ``.venv/jars``,
beside the environment whose pyspark they extend. A server started with :func:`submit_args`
reads and writes Delta tables with Spark's own Delta reader (``spark.read.format("delta")``,
``versionAsOf``, ``DESCRIBE HISTORY``) and reaches S3 through ``s3a://``.

Example::

    argv = ["spark-submit", *submit_args(), "job.py"]
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from devstack.processes import VENV_BIN

DELTA_SQL_CONF = {"spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
                  "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog"}
"""Delta's SQL extension (``DESCRIBE HISTORY``, ``VACUUM``, time travel in SQL) and catalog: both
are static settings, given when a Spark server starts."""


class MissingJars(RuntimeError):
    """The JVM packages are not where :func:`jars` looks; the message says how to fetch them."""


def jars_dir(venv_bin: Path = VENV_BIN) -> Path:
    """Where ``make install`` puts the JVM packages of the environment ``venv_bin`` belongs to."""
    return venv_bin.parent / "jars"


def jars(venv_bin: Path = VENV_BIN) -> list[Path]:
    """The JVM packages fetched for the environment of ``venv_bin``, in name order."""
    found = sorted(jars_dir(venv_bin).glob("*.jar"))
    if not any(path.name.startswith("delta-spark_") for path in found):
        raise MissingJars(f"no delta-spark jar in {jars_dir(venv_bin)}: run `make install` (or `make jars`), which "
                          f"fetches Spark's JVM packages from Maven Central with jvm/pom.xml")
    return found


def submit_args(conf: Mapping[str, str] | None = None, extension: bool = True) -> list[str]:
    """``spark-submit`` arguments that load the JVM packages of this environment (whatever
    interpreter the Spark processes run: the jars are the JVM's) and Delta's extension and
    catalog (unless ``extension`` is False), then ``conf`` (a store's
    :meth:`~falkirk.policies.store.config.StoreConfig.spark_conf`, say)."""
    settings = {**(DELTA_SQL_CONF if extension else {}), **(conf or {})}
    return ["--jars", ",".join(str(path) for path in jars()),
            *(arg for key, value in settings.items() for arg in ("--conf", f"{key}={value}"))]
