"""One module per ``fedsim`` sub-command; see :mod:`fedsim.cli`."""
