"""`python -m tidal_api.cli` is `tidal`."""

from tidal_api.cli import main

main()
