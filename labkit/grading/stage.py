"""A second stage: `python -m labkit.grading.stage IN OUT` runs an exercise's Stage with no student Python.

IN: job.json ({"function": name, "input": what the student's call returned, "scratch": a folder to
build in}) and cases.pt (the case arguments). OUT: <function>.pt, one result per case.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(in_dir: str, out_dir: str) -> None:
    import torch

    from labkit import exercises

    job = json.loads((Path(in_dir) / "job.json").read_text())
    cases = torch.load(Path(in_dir) / "cases.pt", weights_only=True)
    stage = exercises.function(job["function"]).stage
    results = stage.run(job["input"], cases, Path(job["scratch"]))
    torch.save({"cases": results}, Path(out_dir) / f"{job['function']}.pt")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
