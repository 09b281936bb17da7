"""Metrics stream, run summary, privacy report, plots."""
