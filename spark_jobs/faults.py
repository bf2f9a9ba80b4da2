"""Failure injection for jobs: see :mod:`falkirk.policies.faults`."""

from falkirk.policies.faults import BROKEN_ENV, CRASH_ENV, STEPS, broken, crash_point, crash_requested

__all__ = ["BROKEN_ENV", "CRASH_ENV", "STEPS", "broken", "crash_point", "crash_requested"]
