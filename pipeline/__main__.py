"""Entry point: ``python -m pipeline``."""

from pipeline.cli.main import main

main()
