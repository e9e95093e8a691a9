"""Tidal's pure policies: the AIMD gate rule, laxity escalation, pricing and the engine-outage rule.

Nothing in this package does I/O or reads a clock: callers pass the time and
the readings in and get plain values back, so every rule is tested alone on a
scripted clock. The edges that scrape, store and send live elsewhere
(``tidal_workers.gate`` for the AIMD controller).
"""
