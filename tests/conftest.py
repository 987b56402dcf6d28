"""Shared test set-up: labkit decides the device (and the Triton interpreter) before any test imports triton."""
import os
import tempfile

os.environ.setdefault("LABKIT_CACHE", tempfile.mkdtemp(prefix="labkit-test-cache-"))
os.environ.setdefault("MPLBACKEND", "Agg")

import labkit  # noqa: E402

labkit.setup()
