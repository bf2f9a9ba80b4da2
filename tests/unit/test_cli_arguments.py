"""Every argument of ``falkirk new-job`` and ``falkirk watch`` is checked before anything is done:
a bad one exits 2 with one line naming it and the fix, writes nothing, and shows no traceback."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from falkirk.plugins.cli import main


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    """``falkirk ARGV``: its exit code (argparse's own exit included), standard output and error."""
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("first", ["2026-13-01", "2026-02-30", "2026-00-10", "26-01-01", "2026-1-1", "", "tomorrow",
                                   "2026-01-01T00:00"])
def test_new_job_refuses_a_first_date_that_is_no_day_of_the_calendar(first, tmp_path, capsys) -> None:
    code, out, err = run(["new-job", "word_count", "--project", str(tmp_path), "--first", first], capsys)
    assert code == 2 and "--first" in err and "YYYY-MM-DD, a day of the calendar" in err, err
    assert "Traceback" not in err and out == ""
    assert files_under(tmp_path) == []


@pytest.mark.parametrize("name", ["json", "random", "pyspark", "falkirk", "types", "airflow", "os", "deltalake"])
def test_new_job_refuses_a_name_that_hides_a_module_the_job_or_the_dag_imports(name, tmp_path, capsys) -> None:
    code, _, err = run(["new-job", name, "--project", str(tmp_path)], capsys)
    assert code == 2 and f"NAME {name!r}: a module of that name is importable here" in err, err
    assert f"choose another name, e.g. {name}_job" in err and "Traceback" not in err
    assert files_under(tmp_path) == []


@pytest.mark.parametrize("name", ["Word", "1st", "class", "word-count", "", "x" * 64, "wörd"])
def test_new_job_refuses_a_name_that_is_no_module_name(name, tmp_path, capsys) -> None:
    code, _, err = run(["new-job", name, "--project", str(tmp_path)], capsys)
    assert code == 2 and "NAME" in err and "use lower-case letters, digits and _" in err, err
    assert files_under(tmp_path) == []


def test_new_job_refuses_a_project_that_is_no_directory(tmp_path, capsys) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    for project in ("/dev/null", str(a_file), str(a_file / "sub")):
        code, out, err = run(["new-job", "word_count", "--project", project], capsys)
        assert code == 2 and "--project" in err and "Traceback" not in err and out == "", (project, err)
    assert files_under(tmp_path) == ["notes.txt"]


def test_new_job_writes_a_job_and_a_dag_that_parse(tmp_path, capsys) -> None:
    code, out, err = run(["new-job", "word_count", "--project", str(tmp_path / "new"), "--first", "2026-02-28"],
                         capsys)
    assert (code, err) == (0, "")
    assert files_under(tmp_path / "new") == ["dags", "dags/word_count.py", "jobs", "jobs/word_count.py"]
    dag = (tmp_path / "new" / "dags" / "word_count.py").read_text()
    ast.parse(dag), ast.parse((tmp_path / "new" / "jobs" / "word_count.py").read_text())
    assert "first=datetime(2026, 2, 28, tzinfo=timezone.utc)" in dag
    assert "trigger word_count at 2026-02-28T00:00:00+00:00" in out
    # again: refused, nothing overwritten
    code, _, err = run(["new-job", "word_count", "--project", str(tmp_path / "new")], capsys)
    assert code == 2 and "already exists" in err and "nothing was written" in err


@pytest.mark.parametrize("flag, value", [("--poll", "inf"), ("--poll", "-5"), ("--poll", "nan"), ("--poll", "0"),
                                         ("--poll", "5s"), ("--timeout", "1e-300"), ("--timeout", "inf"),
                                         ("--timeout", "nan"), ("--timeout", "-1"), ("--timeout", "1e400")])
def test_watch_refuses_a_number_of_seconds_out_of_range_before_it_pings(flag, value, monkeypatch, capsys) -> None:
    monkeypatch.setenv("FALKIRK_WORKERS", "worker-a,worker-b")
    monkeypatch.delenv("FALKIRK_AIRFLOW_URL", raising=False)
    code, out, err = run(["watch", "--dag", "falkirk_shards", flag, value], capsys)
    assert code == 2 and f"argument {flag}: {value!r}: give a number of seconds from" in err, err
    assert "Traceback" not in err and out == ""


def test_watch_refuses_a_poll_longer_than_the_silence_that_declares_a_worker_lost(monkeypatch, capsys) -> None:
    monkeypatch.setenv("FALKIRK_WORKERS", "worker-a")
    code, out, err = run(["watch", "--dag", "falkirk_shards", "--poll", "60", "--timeout", "30"], capsys)
    assert code == 2 and "--poll 60: a worker is pinged less often than --timeout 30" in err, err
    assert out == ""


@pytest.mark.parametrize("dag", ["x/../falkirk_shards", "./falkirk_shards", "falkirk shards", "a..b", ""])
def test_watch_and_every_command_refuse_a_dag_id_airflow_would_refuse(dag, monkeypatch, capsys) -> None:
    monkeypatch.setenv("FALKIRK_WORKERS", "worker-a")
    for argv in (["watch", "--dag", dag], ["discard", "--dag", dag, "--epochs", "3"], ["gc", "--dag", dag],
                 ["plan", "--dag", dag, "--bad-epoch", "t:1"], ["release", "--dag", dag, "--reason", "x"]):
        code, _, err = run(argv, capsys)
        assert code == 2 and "argument --dag: " in err and "not an Airflow DAG id" in err, (argv, err)


@pytest.mark.parametrize("value", ["x/../t:3", "a b:3", "t..u:2"])
def test_a_task_id_airflow_would_refuse_is_refused_naming_the_flag(value, capsys) -> None:
    code, _, err = run(["plan", "--dag", "falkirk_orders", "--bad-epoch", value], capsys)
    assert code == 2 and f"--bad-epoch {value.rsplit(':', 1)[0]!r}: not an Airflow task id" in err, err


def test_watch_needs_the_workers_it_watches(monkeypatch, capsys) -> None:
    monkeypatch.delenv("FALKIRK_WORKERS", raising=False)
    code, _, err = run(["watch", "--dag", "falkirk_shards"], capsys)
    assert code == 2 and "FALKIRK_WORKERS: name the workers to watch" in err, err
