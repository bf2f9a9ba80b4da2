"""falkirk_shards: a partitioned pipeline (see ``dags/falkirk_shards.py``)."""
