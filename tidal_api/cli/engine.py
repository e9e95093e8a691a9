"""`tidal engine` (being built)."""
COMMANDS: list = []
