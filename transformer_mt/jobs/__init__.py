"""The jobs behind the command line, one module each: each takes its command's typed config.

Jobs import building blocks, never each other. What each module owns: docs/architecture.md.
"""
