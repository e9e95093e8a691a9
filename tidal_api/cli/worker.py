"""`tidal worker` (being built)."""
COMMANDS: list = []
