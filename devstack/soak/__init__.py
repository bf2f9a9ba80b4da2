"""The chaos soak: continuous epochs on the distributed shape while faults land at random times
(``make soak``); :mod:`devstack.soak.schedule` draws the faults from a seed."""
