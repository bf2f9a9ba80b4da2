"""The store's S3-compatible server (:mod:`devstack.s3_server`: moto with a sorted index of each
bucket's key names) lists what S3 lists: every answer is checked against the key names put,
filtered and ordered in Python (the oracle), after puts, overwrites and deletes, with and
without a delimiter, a start-after key and pagination; and in a versioned bucket, where a
deleted key stays as a delete marker."""

from __future__ import annotations

import random

from devstack.s3 import MotoS3


def listed(client, bucket: str, prefix: str, delimiter: str = "", start_after: str = "",  # noqa: ANN001
           page: int = 1000) -> tuple[list[str], list[str]]:
    """Every key and common prefix ListObjectsV2 returns, page after page."""
    keys: list[str] = []
    folders: list[str] = []
    kwargs = {"Bucket": bucket, "Prefix": prefix, "MaxKeys": page}
    if delimiter:
        kwargs["Delimiter"] = delimiter
    if start_after:
        kwargs["StartAfter"] = start_after
    while True:
        answer = client.list_objects_v2(**kwargs)
        keys += [o["Key"] for o in answer.get("Contents", [])]
        folders += [p["Prefix"] for p in answer.get("CommonPrefixes", [])]
        if not answer.get("IsTruncated"):
            return keys, folders
        kwargs = {k: v for k, v in kwargs.items() if k != "StartAfter"}
        kwargs["ContinuationToken"] = answer["NextContinuationToken"]


def expected(names: set[str], prefix: str, delimiter: str = "", start_after: str = "") -> tuple[list[str], list[str]]:
    under = sorted(n for n in names if n.startswith(prefix) and n > start_after)
    if not delimiter:
        return under, []
    keys = [n for n in under if delimiter not in n[len(prefix):]]
    folders = sorted({prefix + n[len(prefix):].split(delimiter)[0] + delimiter for n in under
                      if delimiter in n[len(prefix):]})
    return keys, folders


def test_lists_match_the_keys_put_after_puts_overwrites_and_deletes(s3: MotoS3) -> None:
    client, bucket = s3.client(), "s3-server-listing"
    s3.create_bucket(bucket)
    rng = random.Random(7)
    names = {f"store/{t}/_delta_log/{v:020d}.json" for t in ("a", "ab", "b") for v in range(rng.randint(3, 12))}
    names |= {f"store/a/part-{i}.parquet" for i in range(5)} | {"store/a", "store/a/", "top"}
    for name in sorted(names, key=lambda _: rng.random()):
        client.put_object(Bucket=bucket, Key=name, Body=b"x")
    gone = set(rng.sample(sorted(names), 6))
    for name in gone:
        client.delete_object(Bucket=bucket, Key=name)
    names -= gone
    client.put_object(Bucket=bucket, Key="store/a/_delta_log/_last_checkpoint", Body=b"1")  # put twice
    client.put_object(Bucket=bucket, Key="store/a/_delta_log/_last_checkpoint", Body=b"2")
    names.add("store/a/_delta_log/_last_checkpoint")

    cases = [("store/a/_delta_log/", "", ""), ("store/a", "", ""), ("store/a/", "/", ""), ("store/", "/", ""),
             ("store/a/_delta_log/", "", "store/a/_delta_log/00000000000000000002.json"), ("s", "", ""),
             ("store/c/", "", ""), ("top", "", ""), ("store/ab/_delta_log/0", "", "")]
    for prefix, delimiter, start_after in cases:
        for page in (2, 1000):
            assert listed(client, bucket, prefix, delimiter, start_after, page) == \
                expected(names, prefix, delimiter, start_after), (prefix, delimiter, start_after, page)
    assert client.get_object(Bucket=bucket, Key="store/a/_delta_log/_last_checkpoint")["Body"].read() == b"2"


def test_a_deleted_key_of_a_versioned_bucket_is_not_listed(s3: MotoS3) -> None:
    client, bucket = s3.client(), "s3-server-versioned"
    s3.create_bucket(bucket)
    client.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": "Enabled"})
    for name in ("t/1", "t/2", "t/3"):
        client.put_object(Bucket=bucket, Key=name, Body=b"x")
    client.put_object(Bucket=bucket, Key="t/2", Body=b"y")
    client.delete_object(Bucket=bucket, Key="t/3")  # leaves a delete marker
    assert listed(client, bucket, "t/") == (["t/1", "t/2"], [])
    versions = client.list_object_versions(Bucket=bucket, Prefix="t/")
    assert sorted(v["Key"] for v in versions["Versions"]) == ["t/1", "t/2", "t/2", "t/3"]
    assert [m["Key"] for m in versions["DeleteMarkers"]] == ["t/3"]
