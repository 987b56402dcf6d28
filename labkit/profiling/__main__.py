"""`python -m labkit.profiling trace|ncu|check`: record the profiles the course ships (see labkit.profiling).

Used by: notebook 11 (it names these commands; a GPU host runs them).
"""
from labkit.profiling import main

raise SystemExit(main())
