"""`labkit grade`: the autograder, as a package. Each module has one job:

specs (the hidden cases, joined to the public exercise modules), submissions (finding and reading
notebooks, without following links), sandbox (bubblewrap around every student process), supervise
(running a process under limits), child and stage (the processes that run student code, each a
`python -m` entry point that reads a job folder and writes a results folder), rounds (speed timed from
outside: the parent pairs the child's rounds with those of baseline, a clean process of its own), seal (results signed
with a per-run key), safeio (the parent's file hygiene), student (grading one student), judge
(comparing), report (grades.csv, feedback and the leaderboard), merge (joining shards, their seals
checked), answers (labkit objects that answer an exercise, stubs while it is graded), strip (the copy of
labkit the sandbox mounts, without those answers), cli.
"""
