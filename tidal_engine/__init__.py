"""Tidal inside vLLM: the TidalScheduler plugin and the local tiny engine.

This package runs inside vLLM's processes and imports nothing from
``tidal_api`` or ``tidal_workers``.
"""
