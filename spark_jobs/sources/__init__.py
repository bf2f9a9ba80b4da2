"""Jobs that read a team's own Delta tables (outside the Falkirk store) with Spark."""
