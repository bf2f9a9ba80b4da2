"""The sender-side logs pipeline: orders by region, with no state checkpoint anywhere.

``ingest`` and ``customers`` (sources, outputs logged) -> ``clean`` (stateless) -> ``join`` (a hash
join: the customers seen so far are its build side, each epoch's orders its probe side) ->
``total`` (running totals per region) -> ``report`` (the ranking, the pipeline's sink). ``clean``,
``join`` and ``total`` run under :class:`~falkirk.policies.regimes.SenderLog`: their state is
kept in scratch only, and rebuilt from the blocks their producers retain when it is lost.
"""

from __future__ import annotations

REGIONS = {"ada": "north", "bob": "south", "cy": "north", "dee": "east", "eve": "south"}
# The epoch each customer registers in: orders of a customer not registered yet find no match.
REGISTERED = {"ada": 1, "bob": 1, "cy": 2, "dee": 3, "eve": 5}


def customers_for_epoch(epoch: int) -> list[dict[str, object]]:
    """The customers that register in ``epoch``, with their region.

    >>> customers_for_epoch(1), customers_for_epoch(4)
    ([{'customer': 'ada', 'region': 'north'}, {'customer': 'bob', 'region': 'south'}], [])
    """
    return [{"customer": c, "region": REGIONS[c]} for c, e in sorted(REGISTERED.items()) if e == epoch]
