"""The `labkit` command (the console script's entry point): one subcommand per job, each a module of
labkit.tools, labkit.exercises or labkit.grading with a main(argv) -> int."""
from __future__ import annotations

import importlib
import sys

# subcommand -> (module with a main(argv) -> int, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "run": ("labkit.tools.run", "execute notebooks in batch with papermill and collect their figures"),
    "info": ("labkit.cli", "print what this machine is and its measured ceilings"),
    "exercises": ("labkit.exercises.notebooks", "build exercises/ from solutions/, or check that it is up to date"),
    "grade": ("labkit.grading.cli", "grade students' exercise notebooks: grades.csv and a feedback file each"),
    "bench": ("labkit.tools.bench", "time labkit's Triton kernels against PyTorch eager and torch.compile"),
    "baseline": ("labkit.tools.baseline", "compare a bench run with this device's committed baseline, or save one"),
    "shard": ("labkit.tools.shard", "split notebooks across GPUs/runners by recorded duration, or record durations"),
    "reference": ("labkit.tools.reference", "list each reference run's claims not yet verified on its machine "
                  "(pending.json)"),
    "ran": ("labkit.tools.ran", "check a GPU batch run really ran: no GPU section skipped, not too fast, plots kept"),
    "book": ("labkit.tools.book", "build the course as an HTML book from executed notebooks (`labkit run` folders)"),
}


def info_main(argv: list[str]) -> int:
    import argparse

    import labkit

    ap = argparse.ArgumentParser(prog="labkit info", description="Print the machine and its ceilings.")
    ap.add_argument("--refresh", action="store_true", help="measure the ceilings again instead of using the cache")
    args = ap.parse_args(argv)
    labkit.setup()
    labkit.show_machine()
    print()
    print(labkit.ceilings.get(refresh=args.refresh).table())
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        width = max(map(len, COMMANDS))
        print("usage: labkit COMMAND [ARGS]\n\ncommands:")
        print("\n".join(f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()))
        if argv and argv[0] not in ("-h", "--help"):
            print(f"\nlabkit: unknown command {argv[0]!r}", file=sys.stderr)
            return 2
        return 0
    name, rest = argv[0], argv[1:]
    if name == "info":
        return info_main(rest)
    return int(importlib.import_module(COMMANDS[name][0]).main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
