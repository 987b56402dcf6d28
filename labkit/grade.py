"""`labkit grade`: kept as an entry point (`python -m labkit.grade`); the grader lives in labkit.grading."""
import sys

from labkit.grading.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
