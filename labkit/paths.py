"""Where the course lives: the folder that holds labkit/, notebooks/, solutions/ and exercises/."""
from pathlib import Path

COURSE_ROOT = Path(__file__).resolve().parent.parent
