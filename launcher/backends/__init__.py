"""Backends: where a run directory runs. Each has a dry run (the exact command / script, no side
effects), submit, status, logs and cancel."""
