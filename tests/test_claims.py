import json

import pytest

from labkit import claims


def test_a_claim_that_holds_prints_expected_measured_and_verdict(capsys):
    entry = claims.claim("pinned_faster", "pinned copies beat pageable ones", holds=True,
                         figures={"pinned": (55.1, "GB/s"), "pageable": (8.5, "GB/s")},
                         because="pinned pages go straight to the DMA engine")
    out = capsys.readouterr().out
    assert "[HOLDS] pinned_faster: expected pinned copies beat pageable ones" in out
    assert "pinned 55.1 GB/s, pageable 8.5 GB/s" in out and "DMA engine" in out
    assert entry["status"] == "held" and claims.claims["pinned_faster"] is entry
    json.dumps(entry)  # batch runs store it as data


def test_a_failed_claim_prints_the_explanation_for_this_machine(capsys):
    rate = 3.0
    entry = claims.claim("gpu_wins", "the GPU beats the CPU", holds=False, figures={"speed-up": (rate, "x")},
                         otherwise=lambda: f"only {rate:g}x: this run used quick sizes")
    out = capsys.readouterr().out
    assert entry["status"] == "differs" and "DIFFERS" in out and "why here: only 3x: this run used quick sizes" in out


def test_a_failed_claim_without_explanation_is_a_failure_not_an_expected_difference(capsys):
    assert claims.claim("x", "something", holds=False)["status"] == "failed"
    assert "DOES NOT HOLD" in capsys.readouterr().out


def test_a_skipped_claim_says_what_it_needs(capsys):
    entry = claims.skip("nvlink", "two GPUs talk over NVLink", needs="2 CUDA GPUs")
    assert entry["status"] == "skipped" and "needs: 2 CUDA GPUs" in capsys.readouterr().out


def test_numpy_and_tensor_verdicts_and_figures_are_accepted():
    import numpy as np
    import torch
    entry = claims.claim("np", "numbers", holds=np.bool_(True), figures={"t": torch.tensor(2.0), "n": np.float32(1.5)})
    assert entry["status"] == "held" and entry["figures"]["t"]["value"] == 2.0


@pytest.mark.parametrize("kwargs,error", [
    (dict(name="", expected="e", holds=True), ValueError),
    (dict(name="n", expected="", holds=True), ValueError),
    (dict(name="n", expected="e", holds="yes"), TypeError),
    (dict(name="n", expected="e", holds=True, figures={"f": [1, 2]}), TypeError),
])
def test_bad_claims_get_clear_errors(kwargs, error):
    with pytest.raises(error):
        claims.claim(**kwargs)


def test_guess_none_nudges_and_a_guess_is_compared(capsys):
    assert claims.guess(None, 4.0, "us") is None
    assert "no prediction written" in capsys.readouterr().out
    assert claims.guess(3.0, 4.0, "us") is True
    assert claims.guess(0.1, 4.0, "us") is False
    assert "more than 2x off" in capsys.readouterr().out


def test_claims_are_read_back_and_tallied():
    held = {"name": "a", "status": "held"}
    nb = {"cells": [{"cell_type": "code", "outputs": [{"output_type": "display_data",
                                                       "data": {"text/plain": "...", claims.MIME: held}}]},
                    {"cell_type": "markdown", "source": "x"}]}
    found = claims.claims_in(nb)
    assert found == {"a": held}
    assert claims.tally({"a": held, "b": {"status": "skipped"}}) == {"held": 1, "differs": 0, "failed": 0, "skipped": 1}
