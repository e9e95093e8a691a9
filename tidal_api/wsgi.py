"""The WSGI entry point for gunicorn: ``tidal_api.wsgi:app`` (settings from TIDAL_* variables)."""

from tidal_api import create_app

app = create_app()
