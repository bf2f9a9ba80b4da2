"""The executor of recovery plans: the replay as a reconciler.

:mod:`.executor` checks a plan and takes its lease, then runs :mod:`.loop`: each pass the
:mod:`.observe` observer reads Airflow and the store once, :func:`falkirk.policies.replay.decide`
decides, and the :mod:`.apply` applier (the only code here that writes) carries the actions out.
"""

from falkirk.plugins.replay.executor import ReplayReport, RunningReplay, replay, start_replay

__all__ = ["ReplayReport", "RunningReplay", "replay", "start_replay"]
