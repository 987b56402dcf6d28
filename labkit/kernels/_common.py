"""Input checks and launch helpers shared by labkit's Triton kernels (Launcher: see labkit/kernels/_launch.py)."""
from __future__ import annotations

import functools
import os
from typing import Iterable

import torch
import triton
import triton.language as tl

from labkit import compat
from labkit.device import current, gpu_index
from labkit.kernels._launch import Launcher

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# Decided once, when labkit.kernels is first imported (after labkit.setup()): triton.jit reads
# TRITON_INTERPRET when a kernel is defined, so every kernel here is either compiled for the GPU
# or interpreted on the CPU for the life of the process.
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def dtype_names(dtypes: Iterable[torch.dtype]) -> str:
    return ", ".join(str(d).replace("torch.", "") for d in dtypes)


def check_tensor(op: str, name: str, t: object, dtypes: tuple[torch.dtype, ...] = FLOAT_DTYPES) -> torch.Tensor:
    """Raise a clear error unless `t` is a tensor on the device the kernels run on, of an accepted dtype."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, not {type(t).__name__}")
    if INTERPRETED:
        if t.device.type != "cpu":
            raise ValueError(
                f"{op}: {name} is on {t.device}, but labkit's Triton kernels run in the interpreter on the CPU "
                f"here (labkit.setup() chose {current().device}). Move it with {name}.cpu(), or restart and call "
                f"labkit.setup(device='cuda') before importing labkit.kernels.")
    elif not t.is_cuda:  # (t.device.type: a device object made per call)
        raise ValueError(
            f"{op}: {name} is on {t.device}, but labkit's Triton kernels run on the GPU: "
            f"move it with {name}.to('cuda').")
    if t.dtype not in dtypes:
        to = "float()" if torch.float32 in dtypes else f"to(torch.{dtype_names(dtypes[:1])})"  # one it accepts
        raise TypeError(
            f"{op}: {name} has dtype {str(t.dtype).replace('torch.', '')}; accepted: {dtype_names(dtypes)}. "
            f"Convert it, e.g. {name}.{to}.")
    return t


def check_same_device(op: str, **tensors: torch.Tensor) -> None:
    devices = {n: t.device for n, t in tensors.items()}
    if len(set(devices.values())) > 1:
        where = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise ValueError(f"{op}: all inputs must be on one device ({where}): move them with .to(...).")


def check_same_dtype(op: str, **tensors: torch.Tensor) -> None:
    dtypes = {n: t.dtype for n, t in tensors.items()}
    if len(set(dtypes.values())) > 1:
        what = ", ".join(f"{n} is {str(d).replace('torch.', '')}" for n, d in dtypes.items())
        raise TypeError(f"{op}: inputs must share one dtype ({what}): convert them with .to(dtype).")


_PASSED: set = set()  # (dtype, device) of inputs that passed check_inputs: later ones of that kind skip the checks


def check_inputs(op: str, **tensors: object) -> None:
    """check_tensor (FLOAT_DTYPES) on each of `tensors`, then check_same_device and check_same_dtype. Tensors of
    one (dtype, device) that passed before cost a set look-up, not the checks (they run on every call)."""
    kind = None
    for t in tensors.values():
        if not isinstance(t, torch.Tensor) or (kind is not None and (t.dtype, t.device) != kind):
            break
        kind = (t.dtype, t.device)
    else:
        if kind in _PASSED:
            return
    for name, t in tensors.items():
        check_tensor(op, name, t)
    check_same_device(op, **tensors)
    check_same_dtype(op, **tensors)
    first = next(iter(tensors.values()))
    _PASSED.add((first.dtype, first.device))


def builds_graph(*tensors: object) -> bool:
    """Whether a call on these inputs must record an autograd graph (grad mode on, an input requiring grad)."""
    return torch.is_grad_enabled() and any(getattr(t, "requires_grad", False) for t in tensors)


def rows_2d(x: torch.Tensor) -> torch.Tensor:
    """`x` as (rows, last dim) with a unit stride along the last dim (a view when possible, else a copy)."""
    x2 = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    if x2.shape[-1] > 1 and x2.stride(-1) != 1:
        x2 = x2.contiguous()
    return x2


@functools.lru_cache(maxsize=None)
def num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # the interpreter: a few programs are plenty


@functools.lru_cache(maxsize=None)
def shared_memory(device: torch.device) -> int:
    """Bytes of shared memory one program may use on `device` (as Triton's fused-softmax tutorial reads it)."""
    if device.type != "cuda":
        return 1 << 30  # the interpreter has no limit
    index = gpu_index(device)
    found = compat.max_shared_memory(index)
    return found if found is not None else torch.cuda.get_device_properties(index).shared_memory_per_block_optin


def pipeline_stages(device: torch.device, stage_bytes: int, stages: int) -> int:
    """`stages`, or fewer where that many copies of a pipelined loop's loads (`stage_bytes` each) would not
    fit in one program's shared memory next to Triton's reduction scratch (1 = no pipelining)."""
    return max(1, min(stages, (shared_memory(device) - 16 * 1024) // stage_bytes))


class PlanCache(dict):
    """Launch plans by key, e.g. (M, N, dtype, device): worked out on a key's first call, then one dict look-up
    per call. Emptied past `limit` keys, so a run over many shapes (varying sequence lengths) stays bounded.
    A plan reads the module's tuning tables (FWD_TILE, SPLIT_CHUNK...): whoever changes one at run time (a
    sweep, a test's monkeypatch) calls clear_plans() first, or calls of shapes seen before keep the old plan."""

    caches: list[PlanCache] = []

    def __init__(self, limit: int = 1024):
        super().__init__()
        self.limit = limit
        PlanCache.caches.append(self)

    def put(self, key, plan):
        if len(self) >= self.limit:
            self.clear()
        self[key] = plan
        return plan


def clear_plans() -> None:
    """Forget every kernel's cached launch plans (after changing a tuning table)."""
    for cache in PlanCache.caches:
        cache.clear()


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for a grid on the host (triton.cdiv is a constexpr function there: a few us a call)."""
    return -(-a // b)


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def row_tile(n_cols: int, min_tile: int, elems_per_thread: int, max_warps: int = 32) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) for a kernel that holds BLOCK_M whole rows in registers.

    Short rows are packed several to a program so each program moves at least `min_tile`
    elements; num_warps gives each thread about `elems_per_thread` values. (The defaults in
    each kernel were picked by sweeping tiles and warps on an H200.)
    """
    block_n = next_pow2(n_cols)
    block_m = max(1, min_tile // block_n)
    num_warps = max(4, min(max_warps, block_m * block_n // (32 * elems_per_thread)))
    if INTERPRETED:
        num_warps = 1
    return block_m, block_n, num_warps


@triton.jit
def sum_partials_kernel(partial_ptr, out_ptr, P, N, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr):
    # partial_ptr: fp32 (T, P, N), T stacks of P partial rows; out_ptr: (T, N) in the output dtype.
    # Program (j, t) adds up columns j*BLOCK_N... of stack t over its P rows and rounds once.
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    t = tl.program_id(1)
    col_mask = cols < N
    acc = tl.zeros((BLOCK_N,), tl.float32)
    for start in range(0, P, BLOCK_P):
        r = start + tl.arange(0, BLOCK_P)
        mask = (r < P)[:, None] & col_mask[None, :]
        acc += tl.sum(tl.load(partial_ptr + (t * P + r[:, None]).to(tl.int64) * N + cols[None, :], mask=mask,
                              other=0.0), axis=0)
    tl.store(out_ptr + t * N + cols, acc.to(out_ptr.dtype.element_ty), mask=col_mask)


@triton.jit
def finish_partials(partial_ptr, out_ptr, count_ptr, T, P, N, ARRIVALS, REDUCERS: tl.constexpr):
    # What sum_partials does, at the end of the kernel that left the partials (one launch fewer: issue 39's host
    # path). Every one of the kernel's ARRIVALS programs calls this once its partial rows are stored (fp32
    # (T, P, N) in partial_ptr: T stacks of P rows) and arrives on count_ptr (an int32 zero, see
    # arrival_counter). The last REDUCERS to arrive wait for the others ("acquire": their partials are visible
    # from then on); each then adds up every REDUCERS-th block of FINISH_N columns over the P rows of each stack,
    # in a fixed order, and stores the sums rounded once into out_ptr (T, N). The last to finish sets the counter
    # back to zero for the next launch. Only the last REDUCERS programs ever wait, and the programs they wait for
    # number fewer than REDUCERS: with REDUCERS at most half the SMs (finish_reducers), those always find an SM. In
    # the interpreter (programs one after another) REDUCERS is 1: the last program, which waits for none.
    a = tl.atomic_add(count_ptr, 1, sem="acq_rel")
    r = a - (ARRIVALS - REDUCERS)
    if r >= 0:
        wait_for(count_ptr, ARRIVALS)
        for blk in range(r, tl.cdiv(N, FINISH_N), REDUCERS):
            cols = blk * FINISH_N + tl.arange(0, FINISH_N)
            col_mask = cols < N
            for t in range(T):
                acc = tl.zeros((FINISH_N,), tl.float32)
                for start in range(0, P, FINISH_P):
                    rows = start + tl.arange(0, FINISH_P)
                    mask = (rows < P)[:, None] & col_mask[None, :]
                    acc += tl.sum(tl.load(partial_ptr + (t * P + rows[:, None]).to(tl.int64) * N + cols[None, :],
                                          mask=mask, other=0.0, cache_modifier=".cg"), axis=0)
                tl.store(out_ptr + t * N + cols, acc.to(out_ptr.dtype.element_ty), mask=col_mask)
        if tl.atomic_add(count_ptr, 1, sem="relaxed") == ARRIVALS + REDUCERS - 1:
            tl.atomic_xchg(count_ptr, 0, sem="relaxed")


# finish_partials' tile of partial rows x columns. Narrow column blocks spread the sums over many reducers: with
# 128 columns and 16 reducers, the sums of a layer norm backward of 8192x8192 bf16 on an H100 (8.6 MB of partials)
# added 51 us to the kernel's 152 (2026-11-28).
FINISH_P, FINISH_N = tl.constexpr(64), tl.constexpr(32 if INTERPRETED else 64)


def finish_reducers(arrivals: int, device: torch.device) -> int:
    """REDUCERS for finish_partials in a kernel of `arrivals` programs: no more than arrive, and at most half of
    the device's SMs, so the programs they wait for find an SM even beside another kernel; 1 in the interpreter."""
    return 1 if INTERPRETED else max(1, min(arrivals, num_sms(device) // 2))


_COUNTERS: dict[tuple[int, int], torch.Tensor] = {}
_capturing = compat.stream_capturing_fn()


def arrival_counter(device: torch.device) -> torch.Tensor | None:
    """finish_partials' counter for kernels on `device`'s current stream: an int32 zero made on the first call
    and kept (each launch leaves it at zero; launches on one stream run one after another). None while a CUDA
    graph is being captured, where a counter made or used now would tie eager calls to the graph's replays: the
    caller sums its partials with sum_partials then."""
    if device.type == "cuda":
        if _capturing():
            return None
        index = gpu_index(device)
        key = (index, compat.current_raw_stream(index))
    else:
        key = (-1, 0)
    found = _COUNTERS.get(key)
    if found is None:
        found = _COUNTERS[key] = torch.zeros(1, dtype=torch.int32, device=device)
    return found


_SCRATCH: dict[int, torch.Tensor] = {}  # fp32 partials by id(counter): each stream's counter has its own


def finish_targets(partial_shape: tuple[int, int, int], shape: tuple[int, ...], dtype: torch.dtype,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """(partial, out, counter, fused) for a kernel that adds up its fp32 partial sums (`partial_shape`: T stacks of
    P rows of N) with finish_partials into a new `out` of `shape` and `dtype`. `partial` is scratch kept with
    arrival_counter's counter (each launch on a stream has summed its partials before the next one starts), grown
    to the largest backward's so far: no allocation per call (issue 39's host path). While a CUDA graph is
    captured: a new (T, P, N) `partial`, out and counter stand-ins, fused False: launch with REDUCERS 0 then, and
    add the partials up with sum_partials."""
    counter = arrival_counter(device)
    if counter is None:
        partial = torch.empty(partial_shape, dtype=torch.float32, device=device)
        return partial, partial, partial, False
    T, P, N = partial_shape
    scratch = _SCRATCH.get(id(counter))
    if scratch is None or scratch.numel() < T * P * N:
        scratch = _SCRATCH[id(counter)] = torch.empty(T * P * N, dtype=torch.float32, device=device)
    return scratch, torch.empty(shape, dtype=dtype, device=device), counter, True


def sum_partials(partial: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(T, N) sums over the middle dim of fp32 `partial` (T, P, N), rounded once to `dtype`.

    The backward kernels leave per-program partial sums of dweight/dbias; narrow column blocks give
    enough programs to keep this short (a few blocks over wide ones left most SMs idle). Kernels that can add
    theirs up in their own launch do (finish_partials); this one serves the rest, and CUDA graph captures.
    """
    T, P, N = partial.shape
    out = torch.empty(T, N, dtype=dtype, device=partial.device)
    _sum_partials.launch((cdiv(N, _SUM_META["BLOCK_N"]), T), (partial, out, P, N), _SUM_META)
    return out


_sum_partials = Launcher(sum_partials_kernel)
_SUM_META = dict(BLOCK_P=32, BLOCK_N=32 if INTERPRETED else 64, num_warps=1 if INTERPRETED else 4)


@triton.jit
def split_ticket(ticket_ptr, SPLITS, STAGE: tl.constexpr):
    # (row or row group, chunk) of a program that shares its rows with SPLITS - 1 others. On the GPU
    # (STAGE 0) work goes by ticket (an atomic counter), not program id, so the programs a program waits
    # for already run, or start when another finishes. The interpreter runs programs one after another,
    # so there the kernels run twice (STAGE 1 publishes partials, STAGE 2 uses them) and never wait.
    if STAGE == 0:
        t = tl.atomic_add(ticket_ptr, 1)
    else:
        t = tl.program_id(0)
    return t // SPLITS, t % SPLITS


# The launches of a split kernel: one on the GPU; STAGE 1 then STAGE 2 in the interpreter (see split_ticket).
SPLIT_STAGES = (1, 2) if INTERPRETED else (0,)


def split_exchange(M: int, splits: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """What the programs sharing rows exchange through: fp32 (M, splits, 2) partials, one pair per chunk,
    and int32 (M + 1,) zeros, the chunks arrived per row and, last, the ticket counter (see split_ticket)."""
    return (torch.empty(M, splits, 2, dtype=torch.float32, device=device),
            torch.zeros(M + 1, dtype=torch.int32, device=device))


@triton.jit
def arrive(count_ptr):
    # Count this program in for a shared row, after its stores of the row's partials ("release").
    tl.atomic_add(count_ptr, 1, sem="release")


@triton.jit
def wait_for(count_ptr, expected):
    # Spin until `expected` programs have arrived ("acquire": their stores are visible from here on).
    # Spinning on acquire atomics measured faster than volatile loads plus barriers on an H200.
    while tl.atomic_add(count_ptr, 0, sem="acquire") < expected:
        pass
