"""Tidal's settings: the only package that reads the process environment."""

from config.settings import Settings
from config.settings import load_settings

__all__ = ["Settings", "load_settings"]
