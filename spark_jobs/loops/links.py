"""links (Batch, logged): the epoch's new links between pages, the same on every run.

Epoch ``e`` adds ``PER_EPOCH`` links among ``PAGES`` pages.
"""

from __future__ import annotations

from falkirk.spark_jobs.runtime import EpochContext, EpochResult, run_job

PAGES = 40
PER_EPOCH = 60
SCHEMA = "src long, dst long"


def new_links(epoch: int) -> list[tuple[int, int]]:
    """The links epoch ``epoch`` adds (a page never links to itself).

    >>> new_links(1)[:3]
    [(7, 19), (18, 31), (29, 3)]
    """
    out = []
    for i in range(PER_EPOCH):
        src = (epoch * 7 + i * 11) % PAGES
        dst = (src + 11 + (epoch + i) % 5) % PAGES
        out.append((src, dst if dst != src else (dst + 1) % PAGES))
    return out


def compute(ctx: EpochContext) -> EpochResult:
    return EpochResult(outputs={"output": ctx.spark.createDataFrame(new_links(ctx.epoch), schema=SCHEMA)})


if __name__ == "__main__":
    raise SystemExit(run_job(compute))
