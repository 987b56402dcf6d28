import math

import pytest
import torch

from labkit import figures as rec


def test_record_keeps_and_prints(capsys):
    value = rec.record("copy_gbps", torch.tensor(12.5), "GB/s", note="1 GiB")
    assert value is None, "record() must return None, or a notebook shows a bare Out[n] value"
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


@pytest.mark.parametrize("value,text", [(0.00123, "0.00123"), (123456.7, "123,457"), (3, "3"), (0.0, "0"),
                                        (2.5e-7, "2.5e-07"), ("ok", "ok")])
def test_small_and_large_figures_keep_their_digits(value, text):
    assert rec.fmt_value(value) == text
