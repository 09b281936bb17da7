"""The actors both runtimes run: the client and the server, and the policies they apply.

They see only a :class:`~fedsim.clock.Clock` and an :class:`~fedsim.transports.base.Endpoint`,
never the wall clock or a concrete transport.
"""
