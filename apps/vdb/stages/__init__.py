"""The per-point database chain: insert, index, query sweep (raw rows, I/O counters), mixed insert + query."""
