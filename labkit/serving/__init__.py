"""The inference server of notebook 12 and what it is built from: the batching policy, its simulation,
the served model, the HTTP server, its client and an open-loop load generator.

Used by: notebook 12, exercise 12.
"""
