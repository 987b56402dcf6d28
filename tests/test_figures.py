import math

import pytest
import torch

from labkit import figures as rec


def test_record_keeps_and_prints(capsys):
    value = rec.record("copy_gbps", torch.tensor(12.5), "GB/s", note="1 GiB")
    assert value == 12.5
    assert rec.figures["copy_gbps"] == {"name": "copy_gbps", "value": 12.5, "unit": "GB/s", "note": "1 GiB"}
    assert "copy_gbps = 12.5 GB/s" in capsys.readouterr().out


def test_record_rejects_what_is_not_a_figure():
    with pytest.raises(TypeError, match="number or a string"):
        rec.record("x", [1, 2])
    with pytest.raises(ValueError):
        rec.record("", 1.0)


def test_non_finite_values_stay_json_safe():
    rec.record("overflowed", math.inf)
    assert rec.figures["overflowed"]["value"] == "inf"


def test_figures_are_read_back_from_an_executed_notebook():
    entry = {"name": "speedup", "value": 3.0, "unit": "x", "note": ""}
    nb = {"cells": [
        {"cell_type": "markdown", "source": "hi"},
        {"cell_type": "code", "outputs": [{"output_type": "display_data",
                                           "data": {"text/plain": "speedup = 3", rec.MIME: entry}}]},
        {"cell_type": "code", "outputs": [{"output_type": "stream", "text": "speedup = 99"}]},
    ]}
    assert rec.figures_in(nb) == {"speedup": entry}
