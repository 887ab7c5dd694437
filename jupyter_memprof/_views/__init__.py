"""Views: summaries, the dashboard and exports, built from a Profile's tables; they compute no analysis."""
