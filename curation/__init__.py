"""Cold-start curation: the programmatic long-CoT teacher and the filters (pure, no I/O)."""
