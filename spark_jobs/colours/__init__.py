"""The three-way join of the sender-side logs paper's demonstration, exactly (Smith & Watson, CS-TR-861 §5, Fig. 6).

Three scans (``d1``, ``d2``, ``d3``) deliver colours in blocks of four, one block per epoch;
``join1`` is a hash join building on ``d1`` and probing with ``d2``; ``join2`` builds on
``join1``'s output and probes with ``d3``; ``result`` is the sink. A hash join probes only once
its build side is complete, so each scan starts sending in the epoch after its build side's
last block: ``d1`` in epochs 1-2, ``d2`` in 3-5, ``d3`` in 6-7.

``join1`` outputs 7 rows (red, yellow, black, green, green, yellow, blue) and the result is
green x4, red and blue. Each row carries ``pos``, where it comes from (``d1:0`` is ``d1``'s first
value; a join's row is ``build+probe``), so a row delivered twice shows.

``palette`` feeds a diamond (``dags/falkirk_palette.py``): ``tally`` (a running count per colour)
and ``shades`` (stateless) both read it, and ``merge`` reads both.
"""

from __future__ import annotations

DATA = {
    "d1": ("green", "red", "yellow", "green", "blue", "black"),
    "d2": ("red", "purple", "yellow", "black", "green", "purple", "white", "yellow", "blue"),
    "d3": ("white", "green", "blue", "purple", "green", "orange", "red"),
    "palette": ("red", "green", "blue", "green", "white", "red", "green", "black", "blue", "red", "yellow", "green",
                "purple", "red"),
}
BLOCK = 4
FIRST_EPOCH = {"d1": 1, "d2": 3, "d3": 6, "palette": 1}
END = 7  # d3's last block


def block(scan: str, epoch: int) -> list[dict[str, str]]:
    """The values ``scan`` sends in ``epoch``: its block ``epoch - FIRST_EPOCH[scan]`` of four.

    >>> [v["colour"] for v in block("d3", 7)], block("d3", 7)[0]["pos"], block("d3", 8)
    (['green', 'orange', 'red'], 'd3:4', [])
    """
    start = (epoch - FIRST_EPOCH[scan]) * BLOCK
    if start < 0:
        return []
    return [{"colour": c, "pos": f"{scan}:{start + i}"} for i, c in enumerate(DATA[scan][start:start + BLOCK])]
