"""A second stage: `python -m labkit.grading.stage IN OUT` runs an exercise's Stage with no student Python.

IN: job.json ({"function": name, "input": what the student's call returned, "scratch": a folder to
build in}) and cases.pt (the case arguments); stdin: the run's key. OUT: <function>.pt, one result
per case, and its seal in events.jsonl (the student's C++ runs in this process once built).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from labkit.grading import seal


def main(in_dir: str, out_dir: str) -> None:
    key = seal.read_key()
    import torch

    from labkit import exercises

    job = json.loads((Path(in_dir) / "job.json").read_text())
    cases = torch.load(Path(in_dir) / "cases.pt", weights_only=True)
    stage = exercises.function(job["function"]).stage
    results = stage.run(job["input"], cases, Path(job["scratch"]))
    mac = seal.write(key, out_dir, job["function"], {"cases": results}, torch.save, os.replace)
    with open(Path(out_dir) / "events.jsonl", "a") as f:
        f.write(json.dumps({"ev": "fn_done", "fn": job["function"], "seal": mac}) + "\n")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
