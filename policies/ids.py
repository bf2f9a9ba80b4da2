"""The identities Airflow gives DAGs and tasks, checked by Airflow's own rule.

Airflow accepts a DAG id or a task id made of letters, digits, ``_``, ``.`` and ``-``, at most
250 characters, with no ``..`` (``airflow.utils.helpers.validate_key``). Every id a command,
the API or the view takes is checked here before anything is read or written, so that an id
such as ``x/../orders`` never reaches a REST path (where it would name another DAG) or a
store path (where it would name another DAG's tables).

>>> check_dag_id("falkirk_orders")
'falkirk_orders'
>>> check_dag_id("x/../falkirk_orders")
Traceback (most recent call last):
...
falkirk.policies.ids.IdError: --dag 'x/../falkirk_orders': not an Airflow DAG id: use letters, digits, _, . and - (at most 250 characters, no '..'), e.g. falkirk_orders
"""

from __future__ import annotations

import re

MAX_LENGTH = 250
_KEY = re.compile(r"[\w.-]+")


class IdError(ValueError):
    """An id Airflow would refuse; the message names the field and the fix."""


def is_airflow_key(value: object) -> bool:
    """Whether ``value`` is an id Airflow accepts for a DAG or a task.

    >>> [is_airflow_key(v) for v in ("orders", "group.task", "a..b", "./d", "", "x" * 251, 7)]
    [True, True, False, False, False, False, False]
    """
    return (isinstance(value, str) and 0 < len(value) <= MAX_LENGTH and _KEY.fullmatch(value) is not None
            and ".." not in value)


def _check(value: object, field: str, what: str, example: str) -> str:
    if not is_airflow_key(value):
        shown = repr(value)[:80] if isinstance(value, str) else f"{type(value).__name__}"
        named = f"{field} {shown}" if field else shown  # no field: argparse names the flag itself
        raise IdError(f"{named}: not an Airflow {what} id: use letters, digits, _, . and - (at most {MAX_LENGTH} "
                      f"characters, no '..'), e.g. {example}")
    return value  # type: ignore[return-value]


def check_dag_id(value: object, field: str = "--dag") -> str:
    """``value`` if it is an id Airflow accepts for a DAG, else :class:`IdError` naming ``field``.

    >>> check_dag_id("orders.daily", field="dag_id")
    'orders.daily'
    """
    return _check(value, field, "DAG", "falkirk_orders")


def check_task_id(value: object, field: str = "--task") -> str:
    """``value`` if it is an id Airflow accepts for a task, else :class:`IdError` naming ``field``.

    >>> check_task_id("leaders")
    'leaders'
    >>> check_task_id("lead ers", field="--failed-task")
    Traceback (most recent call last):
    ...
    falkirk.policies.ids.IdError: --failed-task 'lead ers': not an Airflow task id: use letters, digits, _, . and - (at most 250 characters, no '..'), e.g. aggregate
    """
    return _check(value, field, "task", "aggregate")


__all__ = ["IdError", "MAX_LENGTH", "check_dag_id", "check_task_id", "is_airflow_key"]
