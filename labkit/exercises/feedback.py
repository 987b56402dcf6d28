"""What a student reads: one line about an exception, and the verdict of a check on the visible cases."""
from __future__ import annotations

import ast
import os
import traceback
from typing import Any

import torch

from labkit.exercises.spec import Function

LABKIT_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _where(exc: BaseException) -> str:
    """The last line of the student's own code in a traceback (not torch's, not labkit's)."""
    skip = (os.path.dirname(torch.__file__), LABKIT_DIR, "site-packages", "/lib/python")
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        if not any(s in frame.filename for s in skip):
            return f" (in {frame.name}, line {frame.lineno}: {(frame.line or '').strip()[:80]})"
    return ""


def _unwrap(exc: BaseException) -> BaseException:
    """The error inside a Triton interpreter's wrapper (InterpreterError: the kernel's own exception)."""
    while type(exc).__name__ == "InterpreterError" and exc.__cause__ is not None:
        exc = exc.__cause__
    return exc


def _stub_hint(exc: BaseException) -> str | None:
    """The hint of a `raise NotImplementedError(...)` stub that Triton refused to compile in a kernel, else None."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        node = getattr(exc, "node", None)
        if isinstance(node, ast.Raise) and type(exc).__module__.startswith("triton"):
            call = node.exc
            name = call.func if isinstance(call, ast.Call) else call
            if isinstance(name, ast.Name) and name.id == "NotImplementedError":
                args = call.args if isinstance(call, ast.Call) else []
                return str(args[0].value) if args and isinstance(args[0], ast.Constant) else ""
        exc = exc.__cause__ or exc.__context__
    return None


def not_done(exc: BaseException) -> bool:
    """True when `exc` is an exercise stub's NotImplementedError (raised, or refused by Triton's compiler)."""
    return isinstance(_unwrap(exc), NotImplementedError) or _stub_hint(exc) is not None


def describe_error(exc: BaseException) -> str:
    """One line for a student about an exception their code raised."""
    exc = _unwrap(exc)
    if isinstance(exc, NotImplementedError):
        return f"not done yet: {exc}" if str(exc) else "not done yet"
    hint = _stub_hint(exc)
    if hint is not None:
        return f"not done yet: {hint}" if hint else "not done yet"
    text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    return f"raised {type(exc).__name__}{': ' + text if text else ''}{_where(exc)}"


def run_cases(name: str, fn: Any, call, cases: list[dict], compare) -> bool:
    """Call `fn` on each case and compare; print the first problem (or nothing) and return whether all passed."""
    for case in cases:
        try:
            got = call(fn, case["args"])
        except Exception as exc:
            mark = "…" if not_done(exc) else "✗"
            print(f"{mark} {name}: {describe_error(exc)}" + ("" if mark == "…" else f"\n  on {case['about']}"))
            return False
        problems = compare(case["expected"], got, case.get("rtol", 0.0), case.get("atol", 0.0))
        if problems:
            print(f"✗ {name}, on {case['about']}:\n  " + "\n  ".join(problems))
            return False
    return True


def run_check(spec: Function, fn: Any, cases: list[dict] | None = None) -> bool:
    """Run `fn` on the visible cases of `spec` (or its own check); print one verdict; never raise."""
    name = spec.name
    if spec.check is not None and cases is None:
        return spec.check(fn)
    if not callable(fn):
        print(f"✗ {name}: expected a function, got {type(fn).__name__}")
        return False
    try:
        cases = spec.visible() if cases is None else cases
    except Exception as exc:  # e.g. labkit.setup() chose a device this check cannot use
        print(f"✗ {name}: could not make the check's inputs: {describe_error(exc)}")
        return False
    if not run_cases(name, fn, spec.call, cases, spec.compare):
        return False
    print(f"✓ {name}: {len(cases)} visible check{'s' if len(cases) > 1 else ''} passed "
          f"(the grader also tries other sizes, dtypes and seeds)")
    return True
