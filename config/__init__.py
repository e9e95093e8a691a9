"""Tidal's settings: the only package that reads the process environment."""
from config.settings import Settings, load_settings

__all__ = ["Settings", "load_settings"]
