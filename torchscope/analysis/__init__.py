"""Analysis stage: pure functions from trace tables to serialisable results (they never print)."""
