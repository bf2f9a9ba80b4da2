"""The four-regime clicks pipeline: source (Ephemeral) -> clean (Batch, logged) ->
model (LazyCheckpoint every=3) -> sink (EagerCheckpoint)."""
