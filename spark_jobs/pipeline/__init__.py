"""The demo pipeline: ingest (Ephemeral) -> aggregate (EagerCheckpoint) -> publish (Batch, logged)."""
