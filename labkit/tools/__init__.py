"""The course's tools, one module per `labkit` verb (labkit/cli.py dispatches to them): run (notebooks in
batch), shard (splitting them over runners), ran (did a GPU run really run), baseline and bench (kernel
timings), and nbio (reading and writing .ipynb files). Notebooks and lab helpers never import them."""
