# An airflow DAG file: the reference application of the checkout the benchmark runs in
# (FALKIRK_BENCH_CHECKOUT), under the DAG id bench_figure1.
import importlib.util
import os

_spec = importlib.util.spec_from_file_location(
    "falkirk_figure1_dag", os.path.join(os.environ["FALKIRK_BENCH_CHECKOUT"], "dags", "falkirk_figure1.py"))
_figure1 = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_figure1)
figure1 = _figure1.build_dag("bench_figure1")
