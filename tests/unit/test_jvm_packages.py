"""The JVM packages ``make install`` fetched (``jvm/pom.xml`` into ``.venv/jars``): Delta for Spark
4.2 and S3A are there, at the versions the pom names and that match PySpark's own jars, and
nothing PySpark already ships is on Spark's class path twice."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pyspark
import pytest

from devstack.spark_packages import DELTA_SQL_CONF, MissingJars, jars, submit_args

ROOT = Path(__file__).resolve().parents[2]
POM = ROOT / "jvm" / "pom.xml"
SPARK_JARS = Path(pyspark.__file__).parent / "jars"
VERSIONED = re.compile(r"(?P<artifact>.+?)-(?P<version>\d[\w.\-]*)\.jar")


def _artifacts(directory: Path) -> dict[str, str]:
    """artifact -> version of each jar in ``directory``."""
    found = {}
    for path in directory.glob("*.jar"):
        match = VERSIONED.fullmatch(path.name)
        assert match, path.name
        found[match["artifact"]] = match["version"]
    return found


def _pom_property(name: str) -> str:
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    value = ET.parse(POM).getroot().find(f"m:properties/m:{name}", ns)
    assert value is not None and value.text, name
    return value.text


def test_the_fetched_jars_add_delta_and_s3a_and_nothing_pyspark_ships() -> None:
    ours, spark = _artifacts(jars()[0].parent), _artifacts(SPARK_JARS)
    assert ours["delta-spark_4.2_2.13"] == ours["delta-storage"] == _pom_property("delta.version")
    assert ours["hadoop-aws"] == _pom_property("hadoop.version") == spark["hadoop-client-api"]
    assert ours["s3"] == ours["sts"] == _pom_property("awssdk.version")
    assert "bundle" not in ours  # the whole SDK is left out
    assert sorted(set(ours) & set(spark)) == []
    assert sum(path.stat().st_size for path in jars()) < 60_000_000


def test_the_one_jackson_module_delta_adds_is_of_pysparks_jackson() -> None:
    ours, spark = _artifacts(jars()[0].parent), _artifacts(SPARK_JARS)
    assert ours["jackson-datatype-jdk8"] == spark["jackson-databind"] == _pom_property("jackson.version")


def test_submit_args_load_every_jar_with_deltas_extension_and_catalog_then_the_conf_given() -> None:
    args = submit_args(conf={"spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000"})
    assert args[0] == "--jars" and args[1].split(",") == [str(p) for p in jars()]
    assert args[2:] == ["--conf", f"spark.sql.extensions={DELTA_SQL_CONF['spark.sql.extensions']}",
                        "--conf", f"spark.sql.catalog.spark_catalog={DELTA_SQL_CONF['spark.sql.catalog.spark_catalog']}",
                        "--conf", "spark.hadoop.fs.s3a.endpoint=http://127.0.0.1:9000"]


def test_submit_args_without_the_extension_load_the_jars_and_the_conf_given_only() -> None:
    args = submit_args(conf={"spark.hadoop.fs.s3a.endpoint": "http://127.0.0.1:9000"}, extension=False)
    assert args == ["--jars", ",".join(str(p) for p in jars()), "--conf", "spark.hadoop.fs.s3a.endpoint=http://127.0.0.1:9000"]


def test_an_environment_without_the_jars_is_told_how_to_fetch_them(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    with pytest.raises(MissingJars, match=r"run `make install` \(or `make jars`\)"):
        jars(tmp_path / "bin")
