"""report.md and its figures, laid out from the evaluated results: one module per section."""
