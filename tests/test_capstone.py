"""The capstone's training loops: same batches, same function when padded, every variant's loss = the baseline's."""
import dataclasses

import pytest
import torch

import labkit
from labkit.capstone import GPT, GPTConfig, RunConfig, Trainer, make_corpus, run_variant, variant, VARIANTS
from labkit.capstone.data import order
from labkit.capstone.profile import EVIDENCE, METRICS, missing_here, profile_steps
from labkit.capstone.train import calibrate, final_loss, paired_step_ms, tolerance

SEQ, WINDOWS = 16, 16
CORPUS = make_corpus(WINDOWS, SEQ)
CFG = GPTConfig(vocab=CORPUS.vocab, seq=SEQ, d_model=32, heads=2, layers=1)
RUN = RunConfig(CFG, batch=4, steps=8, windows=WINDOWS, compile_backend="aot_eager")
DEV = labkit.current().device  # where labkit's Triton kernels run (the AdamW and Flash variants need it)


def runnable(name: str):
    """The variant as it can run here: without a GPU, CUDA graphs become plain compile (traced by aot_eager)."""
    v = variant(name)
    return dataclasses.replace(v, compile="default") if v.compile == "reduce-overhead" and DEV.type == "cpu" else v


@pytest.fixture(scope="module")
def baseline():
    return run_variant(variant("baseline"), RUN, DEV, CORPUS, time_it=False)


def test_corpus_is_generated_the_same_and_decodes():
    again = make_corpus(WINDOWS, SEQ)
    assert torch.equal(again.tokens, CORPUS.tokens) and CORPUS.tokens.numel() == WINDOWS * SEQ + 1
    assert CORPUS.decode(CORPUS.tokens[:40]).strip() and 20 < CORPUS.vocab < 128
    with pytest.raises(ValueError, match="windows and seq"):
        make_corpus(0, SEQ)


def test_device_batches_are_the_loaders_batches():
    a = Trainer(variant("baseline"), RUN, CORPUS, "cpu")
    b = Trainer(variant("device_data"), RUN, CORPUS, "cpu")
    for _ in range(3 * WINDOWS // RUN.batch):  # three epochs
        (xa, ya), (xb, yb) = a.next_batch(), b.next_batch()
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
        assert torch.equal(xa[:, 1:], ya[:, :-1])
    assert order(WINDOWS, 2, RUN.batch, 0).shape == (2, RUN.batch)


@pytest.mark.parametrize("seed, windows, batch, batches", [(0, 16, 4, 13), (7, 32, 8, 9), (123, 12, 3, 10)])
def test_order_is_the_dataloaders_order_epoch_after_epoch(seed, windows, batch, batches):
    loader = torch.utils.data.DataLoader(range(windows), batch_size=batch, shuffle=True, drop_last=True,
                                         generator=torch.Generator().manual_seed(seed))
    seen = torch.cat([b for _ in range(-(-batches * batch // windows)) for b in loader])[: batches * batch]
    assert torch.equal(order(windows, batches, batch, seed), seen.view(batches, batch))


def test_padding_computes_the_same_function_and_padding_stays_zero():
    plain, padded = GPT(CFG, "naive", 1, seed=3).double(), GPT(CFG, "naive", 64, seed=3).double()
    assert padded.head.weight.shape[0] == 64 and padded.blocks[0].fc.weight.shape[0] % 64 == 0
    idx = torch.randint(0, CFG.vocab, (3, SEQ))
    torch.testing.assert_close(padded(idx), plain(idx))
    loss = padded(idx, torch.randint(0, CFG.vocab, (3, SEQ)))
    loss.backward()
    assert padded.head.weight.grad[CFG.vocab:].abs().max() == 0
    assert padded.blocks[0].fc.weight.grad[CFG.hidden:].abs().max() == 0
    assert padded.blocks[0].out.weight.grad[:, CFG.hidden:].abs().max() == 0


def test_flops_count_by_hand():
    c = GPTConfig(vocab=10, seq=8, d_model=4, heads=2, layers=1, ffn=6)
    assert c.matmul_params() == 4 * 16 + 2 * 4 * 6 + 4 * 10
    assert c.flops_per_token() == 6 * c.matmul_params() + 6 * 1 * 8 * 4


@pytest.mark.parametrize("name", [n for n in VARIANTS if n not in ("baseline", "ddp")])
def test_every_variant_trains_the_baseline_model(name, baseline):
    v = runnable(name)
    r = run_variant(v, RUN, DEV, CORPUS, time_it=False)
    assert len(r.losses) == RUN.steps and r.losses[0] == pytest.approx(baseline.losses[0], rel=1e-2)
    rel = abs(r.loss - baseline.loss) / baseline.loss
    assert rel <= tolerance(v, DEV), (f"{name}: loss {r.loss} vs baseline {baseline.loss} "
                                      f"({rel:.2e} > {tolerance(v, DEV):g})")
    assert r.loss < baseline.losses[0] - 0.1, "the model did not train"


def test_a_step_that_changes_the_result_is_caught(baseline):
    wrong = run_variant(variant("baseline"), dataclasses.replace(RUN, lr=RUN.lr / 4), DEV, CORPUS, time_it=False)
    assert abs(wrong.loss - baseline.loss) / baseline.loss > tolerance(variant("bf16"), DEV)


def test_gpu_only_variants_say_so_on_the_cpu():
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        Trainer(variant("reduce_overhead"), RUN, CORPUS, "cpu")
    assert variant("ddp").needs == "2 CUDA GPUs" and variant("baseline").needs == ""
    with pytest.raises(ValueError, match="pick one of"):
        variant("fastest")


def test_final_loss_is_the_mean_of_the_last_tenth():
    assert final_loss([5.0] * 18 + [1.0, 3.0]) == 2.0 and final_loss([4.0]) == 4.0


def test_ddp_over_two_cpu_processes_trains_the_baseline_model(baseline, tmp_path):
    from labkit.capstone import ddp
    out = ddp.launch(dataclasses.replace(RUN, compile_backend="inductor"), 2, tmp_path / "r.json", device="cpu")
    assert out["world"] == 2 and len(out["losses"]) == RUN.steps
    assert abs(out["loss"] - baseline.loss) / baseline.loss <= tolerance(variant("ddp"), DEV)


def test_every_variant_gets_the_gpu_floor_on_a_gpu_and_its_own_bound_elsewhere():
    from labkit.capstone.train import FP32_RTOL, GPU_RTOL, LOW_RTOL
    assert tolerance(variant("pinned"), "cpu") == FP32_RTOL and tolerance(variant("bf16"), "cpu") == LOW_RTOL
    assert tolerance(variant("pinned"), "cuda") == tolerance(variant("bf16"), torch.device("cuda", 0)) == GPU_RTOL


def test_the_tolerance_comes_from_seeds_where_fp32_and_bf16_train_from_the_same_start():
    cal = calibrate(RUN, DEV, CORPUS, [1, 2])
    assert cal.seeds == [1, 2] and len(cal.fp32) == len(cal.low) == 2
    assert cal.fp32[0] != cal.fp32[1], "another seed trains other weights on another order"
    assert cal.diffs == [(lo - f) / f for f, lo in zip(cal.fp32, cal.low)]
    assert cal.tolerance() == cal.MARGIN * max(abs(d) for d in cal.diffs) > 0  # bf16 rounds: never bit for bit
    assert cal.seed_spread == (max(cal.fp32) - min(cal.fp32)) / (sum(cal.fp32) / 2)


def test_run_variant_keeps_every_timed_sample_and_the_hosts_issue_time():
    run = dataclasses.replace(RUN, rep_ms=5, time_steps=2)
    r = run_variant(variant("pinned"), run, "cpu", CORPUS, min_reps=5, host_reps=4)
    assert r.step_ms.n >= 5 and r.host_ms.n == 4 and all(v > 0 for v in r.host_ms.values)
    assert r.tokens_per_s_samples.values == tuple(run.tokens_per_step * 1e3 / ms for ms in r.step_ms.values)
    assert run_variant(variant("pinned"), run, "cpu", CORPUS, time_it=False).step_ms is None


def test_the_profile_gives_each_figure_once_per_profiled_step():
    t = Trainer(variant("baseline"), RUN, CORPUS, "cpu")
    for _ in range(2):
        t.step()
    p = profile_steps(t.step, steps=3, device="cpu")
    assert p.steps == 3 and all(p.figure(m).n == 3 for m in METRICS)
    assert p.figure("syncs").median == 1  # loss.item() in every step (on the CPU, the call itself)
    assert p.launches() == pytest.approx(sum(p.figure("launches").values) / 3) and p.launches() > 0
    assert p.figure("pointwise").median > 0 and p.figure("busy_ms").median > 0
    assert p.figure("launches").counted and not p.figure("busy_ms").counted  # counts are not excused by load
    assert "calls/step" in p.table(3)


def test_every_step_names_its_evidence_and_what_its_mechanism_needs():
    assert set(EVIDENCE) == set(VARIANTS) - {"baseline", "ddp"}
    assert all(metric in METRICS and 0 < factor < 1 for metric, _, factor, _ in EVIDENCE.values())
    assert missing_here("", "cpu") == ""
    assert ("TF32 tensor cores" in missing_here("tf32", "cpu")
            and "bf16 tensor cores" in missing_here("tensor cores", "cpu"))


def test_paired_timing_alternates_the_two_loops_round_by_round():
    calls = []
    a, b = paired_step_ms(lambda: calls.append("a"), lambda: calls.append("b"), "cpu", rounds=3, steps=2)
    assert a.n == b.n == 3 and calls == ["a", "a", "b", "b", "b", "b", "a", "a", "a", "a", "b", "b"]


def test_a_step_that_takes_away_a_parents_setting_says_so():
    """A variant changes its parent's settings; one that turns off something the parent had (compile mode,
    CUDA graphs, a fused optimizer...) must say what it gives up, never do it silently."""
    from labkit.capstone import changes

    turned_off = {"compile": lambda old, new: old == "reduce-overhead" and new != old,
                  "tf32": lambda old, new: old and not new, "bf16": lambda old, new: old and not new}
    for v in VARIANTS.values():
        lost = [f for f, (old, new) in changes(v).items() if f in turned_off and turned_off[f](old, new)]
        assert not lost or v.gives_up, f"{v.name} turns off its parent's {lost} without saying so (gives_up)"
    assert changes(variant("ddp"))["compile"] == ("reduce-overhead", "default")
    assert "CUDA graphs" in variant("ddp").gives_up and changes(variant("baseline")) == {}
    assert changes(variant("tf32")) == {"tf32": (False, True)}
