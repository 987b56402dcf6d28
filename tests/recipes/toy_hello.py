"""`labkit hello NAME`: a toy verb (CONTRIBUTING, 'Add a labkit verb')."""
from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="labkit hello", description="greet someone")
    ap.add_argument("name")
    args = ap.parse_args(argv)
    if not args.name.strip():
        ap.error("give a name, e.g. labkit hello Ada")
    print(f"hello, {args.name}")
    return 0
