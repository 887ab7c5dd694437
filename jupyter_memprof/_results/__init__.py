"""Results: profiles, comparisons, rank sets, saved and loaded.

Results: a profile, a comparison of two, a set of per-rank profiles, and how they are saved
and loaded (a zip of JSON, a folder of Parquet, the checks both share on load). Results sit
above the views: they draw themselves with the views, which read them through the small
protocols of :mod:`jupyter_memprof._views.protocols`."""
