"""Tidal's HTTP side: the OpenAI-compatible Files and Batches API and the `tidal` command."""

from tidal_api.app import create_app

__all__ = ["create_app"]
