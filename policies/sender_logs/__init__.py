"""Sender-side logs (Smith & Watson): stateful tasks that never checkpoint their state, recovered by
replaying the blocks their producers still retain, the logs pruned by acknowledgement.

* :mod:`.graph`: the data graph's conditions (uniform, acyclic) and its slices of thickness 2.
"""
