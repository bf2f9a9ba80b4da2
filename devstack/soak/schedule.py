"""A soak's fault schedule: which fault, when, against what, drawn from a seed.

The schedule is data, drawn before anything starts: the same seed, duration and mix give the
same faults at the same offsets, so a soak that found a discrepancy is run again by its seed
(``make soak SEED=...``) and meets the same faults in the same order. What the system is
doing when each one lands still varies from run to run; the report records that too.

Faults arrive as a Poisson process (exponential gaps of mean ``mean_gap``, never closer than
``min_gap``, none in the first ``warmup`` or the last ``cooldown`` seconds, so the soak starts
from a running pipeline and ends with time to catch up; by default a minute and two, or a sixth
of a shorter soak each). Each fault's kind is drawn by the
weights of the mix; a worker fault names its worker, a hold (an S3 outage, a clock shift) its
length.

>>> schedule = FaultSchedule.draw(seed=7, duration=600, mix=Mix.parse("kill-worker=1,freeze-s3=1"))
>>> schedule == FaultSchedule.draw(seed=7, duration=600, mix=Mix.parse("kill-worker=1,freeze-s3=1"))
True
>>> {f.kind for f in schedule.faults} <= {"kill-worker", "freeze-s3"}
True
>>> all(60 <= f.at <= 600 - 120 for f in schedule.faults)
True
>>> Mix.parse("kill-worker=2,explode=1")
Traceback (most recent call last):
...
ValueError: --mix: unknown fault 'explode'; the kinds are bad-input, clock-shift, freeze-s3, gc, kill-api-server, kill-job, kill-replay, kill-scheduler, kill-worker, lose-worker, mistaken-trigger, refuse-s3
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

KINDS: Mapping[str, str] = {
    "kill-worker": "SIGKILL of a Celery worker; its disk is kept and it is started again",
    "lose-worker": "SIGKILL of a Celery worker and its disk deleted; 30 s later a new worker of the same name starts "
                   "empty",
    "kill-job": "SIGKILL of a task instance's job at a step of its commit, or inside its epoch",
    "kill-scheduler": "SIGKILL of Airflow's scheduler; it is started again",
    "kill-api-server": "SIGKILL of Airflow's API server; it is started again",
    "kill-replay": "SIGKILL of a running `falkirk replay`; it is run again",
    "freeze-s3": "the S3 endpoint accepts requests and answers none, for the hold",
    "refuse-s3": "the S3 endpoint refuses connections, for the hold",
    "clock-shift": "a worker's clock (and its jobs') runs ahead by the hold, for as long again",
    "mistaken-trigger": "a DAG run triggered at a logical date far past the DAG's latest run",
    "gc": "`falkirk gc` while epochs run",
    "bad-input": "the next epoch's clickstream batch lands incomplete; two epochs later it is delivered again "
                 "whole and recovered as a bad epoch",
}
"""Every fault the soak injects, and what injecting it does."""

WORKER_KINDS = frozenset({"kill-worker", "lose-worker", "clock-shift"})
HOLD_SECONDS: Mapping[str, tuple[float, float]] = {"freeze-s3": (5, 45), "refuse-s3": (5, 45),
                                                   "clock-shift": (30, 300)}
"""The range each held fault's hold is drawn from, in seconds."""


@dataclass(frozen=True)
class Mix:
    """The weight of each fault kind: how often it is drawn, relative to the others."""

    weights: Mapping[str, float]

    def __post_init__(self) -> None:
        for kind, weight in self.weights.items():
            if kind not in KINDS:
                raise ValueError(f"--mix: unknown fault {kind!r}; the kinds are {', '.join(sorted(KINDS))}")
            if not weight >= 0:
                raise ValueError(f"--mix: {kind}={weight!r}: a weight is a number >= 0")
        if not any(self.weights.values()):
            raise ValueError("--mix: every weight is 0; give at least one kind a weight, e.g. kill-worker=1")

    @classmethod
    def every_kind(cls) -> Mix:
        """Each kind once as often as any other (the default).

        >>> sorted(Mix.every_kind().weights) == sorted(KINDS)
        True
        """
        return cls(dict.fromkeys(KINDS, 1.0))

    @classmethod
    def parse(cls, text: str) -> Mix:
        """``kind=weight,kind=weight``; a kind with no ``=weight`` weighs 1.

        >>> Mix.parse("gc, freeze-s3=3").weights
        {'gc': 1.0, 'freeze-s3': 3.0}
        >>> Mix.parse("gc=often")
        Traceback (most recent call last):
        ...
        ValueError: --mix: gc=often: a weight is a number >= 0, e.g. gc=2
        """
        weights: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            kind, _, weight = part.partition("=")
            kind = kind.strip()
            try:
                weights[kind] = float(weight) if weight.strip() else 1.0
            except ValueError:
                raise ValueError(f"--mix: {part}: a weight is a number >= 0, e.g. {kind}=2") from None
        if not weights:
            raise ValueError("--mix: empty; give kinds and weights, e.g. kill-worker=2,freeze-s3=1")
        return cls(weights)

    def spec(self) -> str:
        """The mix as :meth:`parse` reads it.

        >>> Mix.parse("gc=1,kill-job=2.5").spec()
        'gc=1,kill-job=2.5'
        """
        return ",".join(f"{k}={w:g}" for k, w in self.weights.items())


@dataclass(frozen=True)
class Fault:
    """One fault: ``at`` seconds after the soak started, of ``kind``, against ``target`` (a worker,
    for worker faults), held ``hold`` seconds (S3 outages, clock shifts)."""

    at: float
    kind: str
    target: str | None = None
    hold: float | None = None

    def describe(self) -> str:
        """One line of the report.

        >>> Fault(125.5, "freeze-s3", hold=12.0).describe()
        '  125.5s  freeze-s3 for 12.0s'
        >>> Fault(61.0, "lose-worker", target="worker-a").describe()
        '   61.0s  lose-worker worker-a'
        """
        what = f"{self.kind}" + (f" {self.target}" if self.target else "") + (
            f" for {self.hold:.1f}s" if self.hold is not None else "")
        return f"{self.at:7.1f}s  {what}"


@dataclass(frozen=True)
class FaultSchedule:
    """The faults of one soak, in time order, and what drew them."""

    seed: int
    duration: float
    mix: Mix
    faults: tuple[Fault, ...] = field(default=())
    mean_gap: float = 90

    @classmethod
    def draw(cls, seed: int, duration: float, mix: Mix | None = None, *, mean_gap: float = 90,
             min_gap: float = 20, warmup: float | None = None, cooldown: float | None = None,
             workers: Sequence[str] = ("worker-a", "worker-b")) -> FaultSchedule:
        """The faults ``seed`` draws for a soak of ``duration`` seconds.

        >>> s = FaultSchedule.draw(seed=1, duration=3600, mean_gap=60, min_gap=20)
        >>> len(s.faults) >= 30, all(b.at - a.at >= 20 for a, b in zip(s.faults, s.faults[1:]))
        (True, True)
        >>> FaultSchedule.draw(seed=1, duration=20).faults  # shorter than warm-up, cool-down and a gap: none
        ()
        >>> [round(f.at) for f in FaultSchedule.draw(seed=1, duration=180, mean_gap=30).faults]  # 30 s to 150 s
        [50, 93, 114, 145]
        """
        mix = mix or Mix.every_kind()
        if duration <= 0 or mean_gap <= 0 or min_gap < 0:
            raise ValueError(f"duration={duration}, mean_gap={mean_gap}, min_gap={min_gap}: give durations > 0")
        rng = random.Random(seed)
        kinds = [k for k, w in mix.weights.items() if w > 0]
        weights = [mix.weights[k] for k in kinds]
        faults = []
        warmup = min(60.0, duration / 6) if warmup is None else warmup
        cooldown = min(120.0, duration / 6) if cooldown is None else cooldown
        at = warmup
        while True:
            at += max(min_gap, rng.expovariate(1 / mean_gap))
            if at > duration - cooldown:
                break
            kind = rng.choices(kinds, weights)[0]
            target = rng.choice(list(workers)) if kind in WORKER_KINDS else None
            low, high = HOLD_SECONDS.get(kind, (None, None))
            hold = round(rng.uniform(low, high), 1) if low is not None and high is not None else None
            faults.append(Fault(at, kind, target, hold))
        return cls(seed, duration, mix, tuple(faults), mean_gap)

    def counts(self) -> dict[str, int]:
        """How many faults of each kind, most frequent first.

        >>> FaultSchedule(0, 60, Mix.every_kind(), (Fault(1, "gc"), Fault(2, "kill-job"), Fault(3, "gc"))).counts()
        {'gc': 2, 'kill-job': 1}
        """
        counts: dict[str, int] = {}
        for f in self.faults:
            counts[f.kind] = counts.get(f.kind, 0) + 1
        return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    def command(self, broken: str = "") -> str:
        """The command that draws this schedule again.

        >>> FaultSchedule(42, 1200, Mix.parse("gc=1")).command()
        'make soak SEED=42 DURATION=20m MIX=gc=1'
        >>> FaultSchedule(42, 300, Mix.parse("gc=1"), mean_gap=40).command(broken="gc-watermark")
        'make soak SEED=42 DURATION=5m MIX=gc=1 MEAN_GAP=40 BROKEN=gc-watermark'
        """
        minutes = self.duration / 60
        duration = f"{minutes:g}m" if minutes == int(minutes) else f"{self.duration:g}s"
        return (f"make soak SEED={self.seed} DURATION={duration} MIX={self.mix.spec()}"
                + (f" MEAN_GAP={self.mean_gap:g}" if self.mean_gap != 90 else "")
                + (f" BROKEN={broken}" if broken else ""))


def parse_duration(text: str) -> float:
    """Seconds in ``90s``, ``20m``, ``1h`` or a bare number of seconds.

    >>> parse_duration("20m"), parse_duration("1h"), parse_duration("240")
    (1200.0, 3600.0, 240.0)
    >>> parse_duration("soon")
    Traceback (most recent call last):
    ...
    ValueError: DURATION=soon: give seconds, or a number with s, m or h (e.g. 60m)
    """
    units = {"s": 1, "m": 60, "h": 3600}
    text = text.strip()
    number, unit = (text[:-1], units[text[-1]]) if text and text[-1] in units else (text, 1)
    try:
        seconds = float(number) * unit
    except ValueError:
        raise ValueError(f"DURATION={text}: give seconds, or a number with s, m or h (e.g. 60m)") from None
    if seconds <= 0:
        raise ValueError(f"DURATION={text}: give a duration > 0")
    return seconds
