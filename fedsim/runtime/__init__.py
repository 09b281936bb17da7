"""The client and server actors and the two runtimes that run them.

- :mod:`fedsim.runtime.actors`: the client and server actors (they see only a
  :class:`~fedsim.clock.Clock` and an :class:`~fedsim.transports.base.Endpoint`) and their
  policies: admission (pacing, versions), integrity checks, exposure (what the server may
  observe of a client), the window report, helper-task lifetimes.
- Shared by both runtimes: :mod:`~fedsim.runtime.rng` (the seed tree),
  :mod:`~fedsim.runtime.population` (what both runtimes build from a scenario),
  :mod:`~fedsim.runtime.normalisation` (DP data normalisation in a run),
  :mod:`~fedsim.runtime.run_outputs` (the run directory and its one writer) and
  :mod:`~fedsim.runtime.interrupted`.
- :mod:`fedsim.runtime.simulated`: the virtual-time kernel and the in-process run.
- :mod:`fedsim.runtime.deployed`: one process each over MQTT (options, deployment, server and
  client processes, checkpoint, launcher).

Import order inside the runtime, low to high: actors, then the shared modules, then the two
runtimes (which never import each other).
"""
