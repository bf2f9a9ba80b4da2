"""Planning from the ledger: what to restore, what to re-run, what may be forgotten.

* :mod:`.chains`: each task's checkpoint chain F*(p) with exact Ξ, from the ledger.
* :mod:`.recovery`: recovery plans: failures in, frontiers and the exact re-run set out.
* :mod:`.monitor`: low-watermarks, and what they let a sender forget.
* :mod:`.collector`: garbage collection below the low-watermarks.
* :mod:`.recovery_log`: every plan, its lease, and who executed it when.
"""
