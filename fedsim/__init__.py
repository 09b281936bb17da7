"""fedsim: asynchronous federated learning with per-client DP-SGD and f-DP privacy ledgers."""

__version__ = "0.1.0"
