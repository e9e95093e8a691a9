"""`tidal bench`: measurements, not tests. Each result's report (command, machine,
commit, date, raw JSON) goes to a dated folder under docs/results/, its headline to docs/benchmarks.md."""
