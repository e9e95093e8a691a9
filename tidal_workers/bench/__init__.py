"""`tidal bench`: measurements, not tests. Results go to docs/benchmarks.md with command, machine and date."""
