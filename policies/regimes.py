"""Fault-tolerance regimes: what a task persists each epoch, and where.

A regime is a small immutable policy object attached to a task. It answers two
questions the job runtime asks at commit time, and nothing else:

* where do this epoch's outputs go (the durable store, or the volatile scratch tier)?
* does this task keep state across epochs, and is this epoch's state durable?

The regimes follow the Falkirk Wheel's Figure 1 (§2; the table in docs/reference/regimes.md):

>>> EagerCheckpoint().output_tier(epoch=3), EagerCheckpoint().state_tier(epoch=3)
(<Tier.DURABLE: 'durable'>, <Tier.DURABLE: 'durable'>)
>>> LazyCheckpoint(every=2).state_tiers(epoch=3), LazyCheckpoint(every=2).state_tiers(epoch=4)
((<Tier.SCRATCH: 'scratch'>,), (<Tier.SCRATCH: 'scratch'>, <Tier.DURABLE: 'durable'>))
>>> Batch(log_outputs=True).output_tier(epoch=1), Ephemeral().state_tier(epoch=1) is None
(<Tier.DURABLE: 'durable'>, True)

Regimes round-trip through a short text form, used on ``spark-submit`` command lines
and in ledger rows:

>>> Regime.parse("lazy_checkpoint(every=5)")
LazyCheckpoint(every=5, log_outputs=False)
>>> Regime.parse(Batch(log_outputs=True).spec())
Batch(log_outputs=True)
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar


class Tier(str, enum.Enum):
    """Where a table lives: the durable store survives worker loss, scratch does not."""

    DURABLE = "durable"
    SCRATCH = "scratch"


class RegimeError(ValueError):
    """A regime was written or configured wrongly; the message names the field and the fix."""


@dataclass(frozen=True)
class Regime:
    """Base class of the regimes. Use a subclass; see the module docstring."""

    name: ClassVar[str] = ""
    keeps_state: ClassVar[bool] = False
    # How many replicas run each partition (2: process pairs, each a processor of its own).
    replicas: ClassVar[int] = 1

    def output_tier(self, epoch: int) -> Tier:
        """The tier that receives this task's outputs for ``epoch``."""
        raise NotImplementedError

    def state_tiers(self, epoch: int) -> tuple[Tier, ...]:
        """Every tier that receives this task's state after ``epoch`` (none if stateless)."""
        return ()

    def state_tier(self, epoch: int) -> Tier | None:
        """The most durable tier holding the state after ``epoch``: where the checkpoint restores from."""
        tiers = self.state_tiers(epoch)
        return tiers[-1] if tiers else None

    def step_tier(self, epoch: int) -> Tier:
        """Where checkpoints inside ``epoch`` go (:mod:`falkirk.policies.store.steps`): where the
        epoch's own checkpoint restores from, its state's tier or, if stateless, its outputs'.

        >>> LazyCheckpoint(every=2).step_tier(3), EagerCheckpoint().step_tier(3), Batch().step_tier(3)
        (<Tier.SCRATCH: 'scratch'>, <Tier.DURABLE: 'durable'>, <Tier.SCRATCH: 'scratch'>)
        """
        return self.state_tier(epoch) or self.output_tier(epoch)

    def spec(self) -> str:
        """The text form, e.g. ``batch(log_outputs=true)``; :meth:`parse` reads it back."""
        args = ", ".join(f"{k}={_format_value(v)}" for k, v in self._args().items())
        return f"{self.name}({args})" if args else self.name

    def __str__(self) -> str:
        # Airflow serializes a mapped task's arguments with str(): the text form reads back.
        return self.spec()

    def _args(self) -> dict[str, object]:
        return {}

    @staticmethod
    @functools.lru_cache(maxsize=256)  # regimes are immutable; ledgers repeat a few texts many times
    def parse(text: str) -> Regime:
        """Read a regime from its text form (see :meth:`spec`).

        >>> Regime.parse("eager_checkpoint")
        EagerCheckpoint()
        >>> Regime.parse("batch(logs=true)")
        Traceback (most recent call last):
        ...
        falkirk.policies.regimes.RegimeError: regime 'batch': unknown argument 'logs'; batch takes: log_outputs
        """
        match = re.fullmatch(r"\s*([a-z_]+)\s*(?:\((.*)\))?\s*", text or "")
        if not match:
            raise RegimeError(f"regime {text!r} is not of the form name or name(arg=value, ...)")
        name, arg_text = match.group(1), match.group(2)
        cls = _REGIMES.get(name)
        if cls is None:
            raise RegimeError(f"unknown regime {name!r}; choose one of: {', '.join(sorted(_REGIMES))}")
        kwargs: dict[str, object] = {}
        allowed = [f.name for f in fields(cls)]
        for part in filter(None, (p.strip() for p in (arg_text or "").split(","))):
            key, sep, value = part.partition("=")
            key = key.strip()
            if not sep:
                raise RegimeError(f"regime {name!r}: argument {part!r} must be written as name=value")
            if key not in allowed:
                taken = ", ".join(allowed) or "no arguments"
                raise RegimeError(f"regime {name!r}: unknown argument {key!r}; {name} takes: {taken}")
            kwargs[key] = _parse_value(value.strip())
        return cls(**kwargs)


@dataclass(frozen=True)
class Ephemeral(Regime):
    """Persists nothing: outputs live in scratch, the source keeps inputs until acknowledged."""

    name: ClassVar[str] = "ephemeral"

    def output_tier(self, epoch: int) -> Tier:
        return Tier.SCRATCH


@dataclass(frozen=True)
class Batch(Regime):
    """Stateless; with ``log_outputs=True`` its outputs are durable, a firewall for upstream."""

    log_outputs: bool = False
    name: ClassVar[str] = "batch"

    def __post_init__(self) -> None:
        _require_bool(self.name, "log_outputs", self.log_outputs)

    def output_tier(self, epoch: int) -> Tier:
        return Tier.DURABLE if self.log_outputs else Tier.SCRATCH

    def _args(self) -> dict[str, object]:
        return {"log_outputs": self.log_outputs}


@dataclass(frozen=True)
class LazyCheckpoint(Regime):
    """Keeps state; saves it to scratch every epoch, and durably as well every ``every`` epochs."""

    every: int = 1
    log_outputs: bool = False
    name: ClassVar[str] = "lazy_checkpoint"
    keeps_state: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if isinstance(self.every, bool) or not isinstance(self.every, int) or self.every < 1:
            raise RegimeError(
                f"lazy_checkpoint: every={self.every!r} must be a whole number of epochs >= 1"
            )
        _require_bool(self.name, "log_outputs", self.log_outputs)

    def output_tier(self, epoch: int) -> Tier:
        return Tier.DURABLE if self.log_outputs else Tier.SCRATCH

    def state_tiers(self, epoch: int) -> tuple[Tier, ...]:
        return (Tier.SCRATCH, Tier.DURABLE) if epoch % self.every == 0 else (Tier.SCRATCH,)

    def _args(self) -> dict[str, object]:
        return {"every": self.every, "log_outputs": self.log_outputs}


@dataclass(frozen=True)
class EagerCheckpoint(Regime):
    """Keeps state; saves state and outputs durably every epoch, before the epoch is done."""

    name: ClassVar[str] = "eager_checkpoint"
    keeps_state: ClassVar[bool] = True

    def output_tier(self, epoch: int) -> Tier:
        return Tier.DURABLE

    def state_tiers(self, epoch: int) -> tuple[Tier, ...]:
        return (Tier.DURABLE,)


@dataclass(frozen=True)
class ProcessPairs(Regime):
    """Keeps state; runs each partition twice, as replicas ``A`` and ``B`` on two workers, each
    saving its state and outputs durably every epoch (Flux's process pairs, Shah et al.).

    A lost replica costs no rollback: its twin's output of the epoch is already committed, and
    readers switch to it (:mod:`falkirk.policies.pairs`). Twice the compute, for no re-run and
    no wait. Only a partitioned task can be paired; to the planner each replica is a processor
    checkpointed like :class:`EagerCheckpoint`, so when both replicas of a partition are lost
    the partition alone is restored from its durable state and re-executed.

    >>> ProcessPairs().replicas, ProcessPairs().state_tier(epoch=2), Regime.parse("process_pairs")
    (2, <Tier.DURABLE: 'durable'>, ProcessPairs())
    """

    name: ClassVar[str] = "process_pairs"
    keeps_state: ClassVar[bool] = True
    replicas: ClassVar[int] = 2

    def output_tier(self, epoch: int) -> Tier:
        return Tier.DURABLE

    def state_tiers(self, epoch: int) -> tuple[Tier, ...]:
        return (Tier.DURABLE,)


@dataclass(frozen=True)
class SenderLog(Regime):
    """Keeps no checkpoint of its state: its producers retain the blocks (epochs) it has not
    released, and a lost state is rebuilt by replaying them (Smith & Watson, CS-TR-836 and CS-TR-861).

    ``release`` names, per input, when the task no longer needs a block to rebuild its state
    (:mod:`falkirk.policies.sender_logs.release`): ``immediate`` (stateless), ``at_end`` (a full
    aggregation, a hash join's build side; released after epoch ``end``), ``window(k)``, or
    ``custom(package.module:function)``. The state lives only in the scratch tier, as a running
    process keeps it in memory; its outputs are durable, the log downstream replays. A producer's
    block is kept until every reader under this regime has released it.

    ``log_durability`` is ``durable`` (the default: the retained blocks are Delta rows and outlive
    any failure) or ``volatile``, the paper's guarantees: a new incarnation (an attempt after a
    failed one) starts without its predecessor's state and drops the blocks it retained, so a
    reader that needs them later is refused by name (:mod:`falkirk.spark_jobs.sender_logs`).

    >>> r = SenderLog(release={"ingest": "at_end"}, end=10)
    >>> r.spec(), r.keeps_state, r.state_tiers(3), r.output_tier(3)
    ('sender_log(release=ingest:at_end, end=10, log_durability=durable)', True, (<Tier.SCRATCH: 'scratch'>,), <Tier.DURABLE: 'durable'>)
    >>> r.release_point(7), r.release_point(10)  # nothing released before the end; then everything
    (0, 10)
    >>> Regime.parse("sender_log(release=fact:immediate;dim:at_end)").policies()
    {'dim': AtEnd(), 'fact': Immediate()}
    >>> SenderLog(release={"clean": "immediate"}).keeps_state  # releases every block at once: stateless
    False

    ``stateful=True`` keeps a state whatever the release policies say; with ``immediate`` on every
    input that is a contract violation the runtime cannot see (a rebuild then replays nothing):

    >>> Regime.parse(SenderLog(release={"join": "immediate"}, stateful=True).spec()).keeps_state
    True
    """

    release: object = ""
    end: int = 0
    log_durability: str = "durable"
    # None: stateful unless every input is released at once; True/False says so outright.
    stateful: bool | None = None
    name: ClassVar[str] = "sender_log"

    def __post_init__(self) -> None:
        from falkirk.policies.sender_logs.release import ReleaseError, parse_release

        items = (self.release.items() if isinstance(self.release, Mapping)
                 else [part.partition(":")[::2] for part in str(self.release).split(";") if part.strip()])
        policies: dict[str, object] = {}
        for task, policy in items:
            task = str(task).strip()
            if not task:
                raise RegimeError(f"sender_log: release={self.release!r}: name each input, as "
                                  f"release={{'ingest': 'at_end'}} or release=ingest:at_end;dim:window(3)")
            try:
                policies[task] = policy if hasattr(policy, "released") else parse_release(str(policy))
            except ReleaseError as exc:
                raise RegimeError(f"sender_log: release of input {task!r}: {exc}") from None
        if not policies:
            raise RegimeError("sender_log: give a release policy per input, e.g. release={'ingest': 'at_end'}")
        text = ";".join(f"{t}:{policies[t].spec()}" for t in sorted(policies))  # type: ignore[attr-defined]
        object.__setattr__(self, "release", text)
        object.__setattr__(self, "_policies", tuple(sorted(policies.items())))  # not a field: parsed once
        if isinstance(self.end, bool) or not isinstance(self.end, int) or self.end < 0:
            raise RegimeError(f"sender_log: end={self.end!r} must be the execution's last epoch (an int), or 0 "
                              f"for none")
        if self.log_durability not in ("durable", "volatile"):
            raise RegimeError(f"sender_log: log_durability={self.log_durability!r} must be durable or volatile")
        if self.stateful is not None:
            _require_bool(self.name, "stateful", self.stateful)

    def policies(self) -> dict[str, Any]:
        """The release policy of each input, by input task."""
        return dict(self._policies)  # type: ignore[attr-defined]

    def released(self, through: int) -> dict[str, int]:
        """Per input, the newest epoch released once epochs ``1..through`` are processed: the
        state after ``through`` depends only on that input's blocks after it.

        >>> SenderLog(release={"dim": "at_end", "fact": "immediate"}, end=10).released(7)
        {'dim': 0, 'fact': 7}
        """
        final = bool(self.end) and through >= self.end
        return {u: policy.released(through, final) for u, policy in sorted(self.policies().items())}

    def release_point(self, through: int) -> int:
        """The newest epoch released on every input (:meth:`released`)."""
        return min(self.released(through).values())

    @property  # type: ignore[misc]
    def keeps_state(self) -> bool:  # type: ignore[override]
        if self.stateful is not None:
            return self.stateful
        return any(policy.name != "immediate" for policy in self.policies().values())

    def output_tier(self, epoch: int) -> Tier:
        return Tier.DURABLE

    def state_tiers(self, epoch: int) -> tuple[Tier, ...]:
        return (Tier.SCRATCH,) if self.keeps_state else ()

    def _args(self) -> dict[str, object]:
        return {"release": self.release, **({"end": self.end} if self.end else {}),
                "log_durability": self.log_durability,
                **({"stateful": self.stateful} if self.stateful is not None else {})}


_REGIMES: dict[str, type[Regime]] = {
    cls.name: cls for cls in (Ephemeral, Batch, LazyCheckpoint, EagerCheckpoint, ProcessPairs, SenderLog)
}


def _require_bool(regime: str, field: str, value: object) -> None:
    if not isinstance(value, bool):
        raise RegimeError(f"{regime}: {field}={value!r} must be true or false")


def _format_value(value: object) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _parse_value(text: str) -> object:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        return int(text)
    except ValueError:
        return text
