"""The durable store: where checkpoints live and how they are committed and read.

* :mod:`.config`: the store's two roots (durable, scratch) and their table URIs.
* :mod:`.commits`: the commit protocol: one idempotent Delta commit per (task, epoch),
  and the one answer to "is this commit still readable?" (:func:`.commits.missing_commit`).
* :mod:`.ledger`: the ledger table, one row per committed (task, epoch).
* :mod:`.control`: the control tables beside it: invalidations, collections, deliveries.
* :mod:`.readability`: what the store can still read, for planning.
* :mod:`.steps`: the step log of checkpoints inside an epoch.
"""

from falkirk.policies.store.config import SCRATCH_ENV, STORE_ENV, StoreConfig, StoreError

__all__ = ["SCRATCH_ENV", "STORE_ENV", "StoreConfig", "StoreError"]
