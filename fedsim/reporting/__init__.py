"""Reading run directories (written by :mod:`fedsim.runtime.run_outputs`): summary, privacy
report, plots, progress."""
