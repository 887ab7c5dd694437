"""Analysis: pure functions from records to tables, and from tables to answers (categories, lineage, peak, timeline)."""
