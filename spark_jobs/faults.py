"""Failure injection for jobs: see :mod:`policies.faults`."""

from policies.faults import CRASH_ENV, STEPS, crash_point, crash_requested

__all__ = ["CRASH_ENV", "STEPS", "crash_point", "crash_requested"]
