"""The simulated runtime: one scenario, one process, deterministic virtual time."""
