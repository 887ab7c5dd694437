"""Front ends: profile(), the magics, the panel and the session."""
