"""Falkirk policies: regimes, epochs, stores and the checkpoint ledger.

Pure Python: nothing here imports Airflow or Spark, so the API server, the scheduler,
a Spark driver and the tests all share it.
"""

from falkirk.policies.epochs import EpochClock, EpochError
from falkirk.policies.regimes import (
                                      Batch,
                                      EagerCheckpoint,
                                      Ephemeral,
                                      LazyCheckpoint,
                                      ProcessPairs,
                                      Regime,
                                      RegimeError,
                                      SenderLog,
                                      Tier,
)
from falkirk.policies.store import StoreConfig, StoreError
from falkirk.policies.store.commits import CommitKey, CommitResult, EpochTableError, commit_epoch, read_epoch
from falkirk.policies.store.ledger import Ledger, LedgerEntry, LedgerError, OutputRef

__all__ = [
    "Batch", "CommitKey", "CommitResult", "EagerCheckpoint", "Ephemeral", "EpochClock", "EpochError",
    "EpochTableError", "LazyCheckpoint", "Ledger", "LedgerEntry", "LedgerError", "OutputRef", "ProcessPairs", "Regime",
    "RegimeError", "SenderLog", "StoreConfig", "StoreError", "Tier", "commit_epoch", "read_epoch",
]
