"""Sender-side logs (Smith & Watson): stateful tasks that never checkpoint their state, recovered by
replaying the blocks their producers still retain, the logs pruned by acknowledgement.

* :mod:`.graph`: the data graph's conditions (uniform, acyclic) and its slices of thickness 2;
* :mod:`.release`: when a consumer no longer needs an input block (its release policy per input);
* :mod:`.acks`: acknowledgements by the slice sinks, and the blocks an edge still retains;
* :mod:`.rebuild`: what a new incarnation replays to rebuild its state, or which blocks are lost.

Pure decisions, like the rest of :mod:`falkirk.policies`: the runtime and the planner act on them.
"""
