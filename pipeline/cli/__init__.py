"""The command line (python -m pipeline): run, plan, validate, status, submit, dataset, report, compare."""
