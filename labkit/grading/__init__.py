"""`labkit grade`: the autograder, as a package. Each module has one job:

specs (the hidden cases, joined to the public exercise modules), submissions (finding and reading
notebooks), supervise (running a child under limits), child and stage (the processes that run
student code, each a `python -m` entry point that reads a job folder and writes a results folder),
student (grading one student), judge (comparing), report (grades.csv and feedback), cli.
"""
