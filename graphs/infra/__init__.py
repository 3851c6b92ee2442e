"""Infrastructure every stage shares: output folders and locks, DuckDB connections, config checks, the variant registry, host memory, child processes, progress lines and plots."""
