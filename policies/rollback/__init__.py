"""The rollback math of the Falkirk Wheel, independent of Airflow, Spark and the store.

Time domains and frontiers (:mod:`.times`, :mod:`.frontiers`), edge projections
(:mod:`.projections`), the dataflow graph (:mod:`.graph`), checkpoint metadata Ξ and
chains F* (:mod:`.metadata`), the solver's fixed point (:mod:`.solver`), the reset that
follows it (:mod:`.reset`), and the scenario file format with its command line
(:mod:`.scenario`, :mod:`.cli`).
"""
