"""The foundation: errors and the content-addressed store. Imports nothing else of this project."""
