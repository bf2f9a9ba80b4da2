"""The demo pipeline's external source: a deterministic stream of orders, one batch per epoch.

It stands for a client that keeps its input until acknowledged (the Ephemeral regime's
contract): asking again for an epoch returns the same rows. Some amounts are zero or
negative on purpose; ``ingest`` drops them as invalid.

>>> rows = orders_for_epoch(1)
>>> len(rows), rows[0]
(24, {'order_id': 1000, 'customer': 'bob', 'amount': 6})
"""

from __future__ import annotations

CUSTOMERS = ("ada", "bob", "cy", "dee", "eve")
ORDERS_PER_EPOCH = 24


def orders_for_epoch(epoch: int) -> list[dict[str, object]]:
    """The orders that arrive in ``epoch``: ``order_id``, ``customer`` and ``amount``."""
    return [
        {
            "order_id": epoch * 1000 + i,
            "customer": CUSTOMERS[(i * 7 + epoch) % len(CUSTOMERS)],
            "amount": (i * 37 + epoch * 11) % 50 - 5,
        }
        for i in range(ORDERS_PER_EPOCH)
    ]
