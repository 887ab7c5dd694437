"""Views: summaries, dashboards and exports; no analysis."""
