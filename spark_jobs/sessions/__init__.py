"""The jobs of ``dags/falkirk_pairs.py``: Flux's running example (sessions per (src, dst), then
running statistics per (app, src)), with both stateful tasks run as process pairs."""
