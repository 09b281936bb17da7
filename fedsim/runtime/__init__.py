"""The client and server actors and the two runtimes that run them.

Shared: :mod:`~fedsim.runtime.client` and :mod:`~fedsim.runtime.server` (the actors: they see
only a :class:`~fedsim.clock.Clock` and an :class:`~fedsim.transports.base.Endpoint`),
:mod:`~fedsim.runtime.population` (what both runtimes build from a scenario),
:mod:`~fedsim.runtime.posture` (a group's DP schedule), :mod:`~fedsim.runtime.exposure` (what
the server may observe of a client), :mod:`~fedsim.runtime.rng` (the seed tree), :mod:`~fedsim.runtime.run_outputs` (the run directory and its one writer),
:mod:`~fedsim.runtime.tasks` (helper-task lifetimes).

Virtual time, one process: :mod:`~fedsim.runtime.kernel` and :mod:`~fedsim.runtime.simulation`.
Deployed, one process each: :mod:`~fedsim.runtime.options`, :mod:`~fedsim.runtime.deployment`,
:mod:`~fedsim.runtime.server_process` (+ :mod:`~fedsim.runtime.checkpoint`),
:mod:`~fedsim.runtime.client_process`, :mod:`~fedsim.runtime.launcher`.
"""
