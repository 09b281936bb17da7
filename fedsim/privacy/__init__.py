"""Pure privacy accounting: events, accountants (pld / rdp / gdp-clt), trade-off curves,
conversions, calibration, schedules; ``ledger`` adds durable per-client budgets. No torch here."""
