"""falkirk_loops: long epochs that checkpoint inside themselves (iterations, chunks)."""
