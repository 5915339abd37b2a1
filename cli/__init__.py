"""The `r1` command: run the pipeline on a profile, show a profile."""
