"""The run configuration: its models, the YAML loader and guard, cross-field checks, the generated
reference.
"""
