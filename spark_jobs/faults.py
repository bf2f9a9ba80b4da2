"""Failure injection for jobs: see :mod:`falkirk.policies.faults`."""

from falkirk.policies.faults import CRASH_ENV, STEPS, crash_point, crash_requested

__all__ = ["CRASH_ENV", "STEPS", "crash_point", "crash_requested"]
