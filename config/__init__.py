"""Tidal's settings: the only package that reads the process environment."""

from config.settings import SchedulerSettings
from config.settings import Settings
from config.settings import load_scheduler_settings
from config.settings import load_settings

__all__ = ["SchedulerSettings", "Settings", "load_scheduler_settings", "load_settings"]
