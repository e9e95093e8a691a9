"""`tidal serve` (being built)."""
COMMANDS: list = []
