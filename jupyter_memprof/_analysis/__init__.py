"""Analysis: pure functions from records to tables to answers."""
