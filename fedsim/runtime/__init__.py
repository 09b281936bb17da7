"""Clocks (virtual / wall), the simulation kernel, client and server actors, seeded RNG tree."""
