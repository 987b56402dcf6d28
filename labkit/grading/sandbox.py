"""The OS sandbox around every grading process: bubblewrap (`bwrap`), a well-kept Linux tool.

Inside, the process sees the system (/usr, /lib, /sys), Python and the `labkit` package read-only,
its job folder read-only at /grader/in and its results folder at /grader/out (the only host folder
it can write), a private /tmp and /dev/shm (tmpfs of bounded size), no network, of the GPUs only its
worker's device node (own_gpus), its own PID and user namespaces (it runs as `nobody`, cannot see or
signal the grader, and dies with it). The solutions, the graded tests, other submissions, the output
folder and the work folders of other students are not mounted at all. `NoSandbox`
(--unsafe-no-sandbox) runs the same command bare, under keeper.py, which keeps what it detaches in its tree.
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from labkit.paths import COURSE_ROOT

INSTALL = ("install bubblewrap: `sudo apt-get install bubblewrap` (Debian, Ubuntu), `sudo dnf install bubblewrap` "
           "(Fedora, RHEL), or grade inside a container (README, 'For instructors'); --unsafe-no-sandbox grades "
           "without it, for submissions you trust")
SYSTEM = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/sys", "/etc/ld.so.cache",
          "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives", "/etc/passwd", "/etc/group",
          "/etc/nsswitch.conf", "/etc/localtime")
IN, OUT, SCRATCH = "/grader/in", "/grader/out", "/tmp/scratch"
SCRATCH_DIRS = ("cwd", "home", "tmp", "cache", "triton", "ext", "build")
KEEPER = Path(__file__).resolve().with_name("keeper.py")  # runs the process without a sandbox (NoSandbox)
NOBODY = "65534"


def exit_code(rc: int) -> int:
    """bwrap (and the keeper) exit with 128 + N when the process inside was killed by signal N: as Popen would
    say it."""
    return -(rc - 128) if 128 < rc < 128 + 65 else rc


class SandboxError(RuntimeError):
    """The sandbox cannot be set up here; the message says why and what to do."""


def _inside(p: str, root: str) -> bool:
    return p == root or p.startswith(root.rstrip("/") + "/")


def _python_paths() -> list[str]:
    """Where Python, its standard library and its installed packages live (what the child imports)."""
    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix,
             os.path.dirname(os.path.realpath(sys.executable))]
    paths += [p for p in sys.path if p and os.path.isabs(p)]
    return [os.path.realpath(p) for p in paths if os.path.isdir(p)]


def system_links() -> list[tuple[str, str]]:
    """(target, path) of the top-level system links (/bin -> usr/bin on merged-/usr systems), made again inside."""
    return [(os.readlink(p), p) for p in SYSTEM if p.count("/") == 1 and os.path.islink(p)]


def read_only_paths(protected: list[Path], extra: list[str] = ()) -> list[str]:
    """The host paths bound read-only: system, Python, labkit; none may hold a protected path."""
    prot = [os.path.realpath(p) for p in protected]
    package = os.path.realpath(COURSE_ROOT / "labkit")
    for p in prot:
        if _inside(package, p):
            raise SandboxError(f"{p} holds the labkit package itself, which the students' processes must read: "
                               f"put submissions and --out in folders of their own")
    links = {p for _, p in system_links()}
    wanted = [p for p in SYSTEM if os.path.lexists(p) and p not in links] + _python_paths() + [package] + list(extra)
    chosen: list[str] = []
    for p in wanted:
        real = os.path.realpath(p) if not p.startswith("/etc/") else p
        if any(_inside(q, real) for q in prot):
            if real in map(os.path.realpath, (sys.prefix, sys.base_prefix)):
                raise SandboxError(f"Python lives in {real}, which holds {next(q for q in prot if _inside(q, real))}: "
                                   f"move the submissions, solutions or --out folder out of it")
            continue  # e.g. the course root on sys.path: only labkit/ inside it is bound
        if not any(_inside(real, c) for c in chosen):
            chosen = [c for c in chosen if not _inside(c, real)] + [real]
    return chosen


def toolchain_paths() -> list[str]:
    """Install prefixes of the compilers a student's kernel needs (Triton's launcher stub, ptxas, nvcc, the C++
    extension build) where they live outside the system folders, e.g. CC=/opt/gcc/bin/gcc binds /opt/gcc."""
    names = [os.environ.get(v, "").split(" ")[0] for v in ("CC", "CXX")]
    names += ["gcc", "g++", "cc", "c++", "nvcc", "ptxas", "ninja"]
    prefixes = [p for p in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")) if p and os.path.isdir(p)]
    for exe in filter(None, (shutil.which(n) for n in names if n)):
        for path in {exe, os.path.realpath(exe)}:
            folder = os.path.dirname(path)
            prefix = os.path.dirname(folder) if os.path.basename(folder) == "bin" else folder
            if prefix not in ("", "/") and not any(_inside(prefix, s) for s in SYSTEM):
                prefixes.append(prefix)
    return sorted(set(prefixes))


def gpu_devices() -> list[str]:
    return sorted(glob.glob("/dev/nvidia*")) + sorted(glob.glob("/dev/dxg"))


def gpu_minors(proc: str = "/proc/driver/nvidia/gpus") -> dict[str, int]:
    """{'GPU-<uuid>': the minor number of its device node, /dev/nvidia<minor>}, from the NVIDIA driver's files."""
    found = {}
    for info in glob.glob(os.path.join(proc, "*", "information")):
        with open(info, encoding="utf-8", errors="replace") as f:
            fields = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in f)}
        uuid, minor = fields.get("GPU UUID", ""), fields.get("Device Minor", "")
        if uuid.startswith("GPU-") and minor.isdigit():
            found[uuid] = int(minor)
    return found


def own_gpu_nodes(devices: list[str], minor: int) -> list[str]:
    """The device nodes a process needs for GPU `minor` alone: the driver's shared ones (nvidiactl, nvidia-uvm,
    ...) and /dev/nvidia<minor>; no other GPU's node."""
    return [d for d in devices if not re.fullmatch(r"nvidia\d+", os.path.basename(d))
            or os.path.basename(d) == f"nvidia{minor}"]


def own_gpus(slots: list[str], uuids: list[str], devices: list[str],
             proc: str = "/proc/driver/nvidia/gpus") -> tuple[dict[str, tuple[str, list[str]]], str | None]:
    """({worker's CUDA_VISIBLE_DEVICES value: (its GPU's 'GPU-<uuid>', the device nodes of that GPU alone)}, None),
    or ({}, why not) where some worker's GPU has no device node of its own here (MIG, WSL, no driver files)."""
    minors = gpu_minors(proc)
    nodes = {os.path.basename(d) for d in devices}
    own = {}
    for slot, uuid in zip(slots, uuids):
        uuid = uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
        if f"nvidia{minors.get(uuid)}" not in nodes:
            return {}, f"GPU {slot} ({uuid}) has no /dev/nvidia<N> of its own in {proc}"
        own[slot] = (uuid, own_gpu_nodes(devices, minors[uuid]))
    return own, None


@dataclass
class Bwrap:
    """Runs `python -m MODULE /grader/in /grader/out` inside bubblewrap."""

    exe: str
    read_only: list[str]
    links: list[tuple[str, str]] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    tmp_mb: int = 1024
    shm_mb: int = 64
    features: tuple[str, ...] = ()
    scratch: Path = Path(SCRATCH)
    name: str = "bubblewrap"
    gpus: dict[str, tuple[str, list[str]]] = field(default_factory=dict)  # own_gpus: each worker's GPU alone

    def base(self, devices: list[str] | None = None) -> list[str]:
        args = [self.exe, "--unshare-all", "--unshare-user", "--uid", NOBODY, "--gid", NOBODY,
                "--die-with-parent", "--new-session", "--hostname", "grader", "--proc", "/proc", "--dev", "/dev"]
        if "--disable-userns" in self.features:
            args.append("--disable-userns")  # no nested namespaces: less kernel surface
        for size, mount in ((self.shm_mb, "/dev/shm"), (self.tmp_mb, "/tmp")):  # first: binds below /tmp stay
            args += (["--size", str(size * 2**20)] if "--size" in self.features else []) + ["--tmpfs", mount]
        for p in self.read_only:
            args += ["--ro-bind", p, p]
        for target, p in self.links:
            args += ["--symlink", target, p]
        for d in self.devices if devices is None else devices:
            args += ["--dev-bind-try", d, d]
        for sub in SCRATCH_DIRS:
            args += ["--dir", f"{SCRATCH}/{sub}"]
        return args + ["--chdir", f"{SCRATCH}/cwd"]

    def command(self, module: str, in_dir: Path, out_dir: Path, env: dict, work: Path,
                labkit_copy: Path | None = None) -> tuple[list[str], str]:
        """(argv, cwd) of a run; in_dir and out_dir are the parent's folders for it; `labkit_copy` (a package
        folder, labkit.grading.strip) is mounted where labkit is. A worker's GPU (env's CUDA_VISIBLE_DEVICES, in
        self.gpus) is the only one whose device node exists inside, and CUDA there names it by its UUID."""
        own = self.gpus.get(env.get("CUDA_VISIBLE_DEVICES", ""))
        if own is not None:
            env = {**env, "CUDA_VISIBLE_DEVICES": own[0]}
        args = self.base(own[1] if own is not None else None) + [
            "--ro-bind", str(in_dir), IN, "--bind", str(out_dir), OUT, "--clearenv"]
        if labkit_copy is not None:
            args[args.index("--clearenv"):args.index("--clearenv")] = [
                "--ro-bind", str(labkit_copy), os.path.realpath(COURSE_ROOT / "labkit")]
        for k, v in env.items():
            args += ["--setenv", k, v]
        return args + ["--", sys.executable, "-m", module, IN, OUT], "/"

    def scratch_for(self, work: Path) -> Path:
        return self.scratch

    exit_code = staticmethod(exit_code)

    def probe(self, imports: bool = True) -> None:
        """Start Python in the sandbox (importing torch and labkit when `imports`); SandboxError if it cannot."""
        code = ("import torch, labkit; " if imports else "") + "open('/grader/out/ok', 'w').write('ok')"
        pythonpath = os.pathsep.join([str(COURSE_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                            if p])
        with tempfile.TemporaryDirectory(prefix="labkit-probe-") as d:
            (Path(d) / "in").mkdir()
            (Path(d) / "out").mkdir()
            args = self.base() + ["--ro-bind", f"{d}/in", IN, "--bind", f"{d}/out", OUT, "--setenv", "PYTHONPATH",
                                  pythonpath, "--setenv", "HOME", f"{SCRATCH}/home", "--",
                                  sys.executable, "-c", code]
            run = subprocess.run(args, capture_output=True, text=True, timeout=300, check=False)
            if (Path(d) / "out" / "ok").exists():
                return
            said = (run.stderr or run.stdout).strip()
        if said.startswith("bwrap:"):
            raise SandboxError(
                f"bubblewrap ({self.exe}) cannot start a sandbox here: {said[:300]}\n"
                "User namespaces may be restricted: see `sysctl kernel.unprivileged_userns_clone "
                "user.max_user_namespaces kernel.apparmor_restrict_unprivileged_userns` (Ubuntu 24.04 needs an "
                "AppArmor profile for bwrap, or run the grader as root), or grade inside a container "
                f"(README, 'For instructors'). {INSTALL.split('; ')[-1]}")
        raise SandboxError(f"Python cannot import torch and labkit inside the sandbox ({said[-400:]}). It sees only "
                           f"{', '.join(self.read_only)}: is a package installed inside the submissions, solutions "
                           f"or output folder?")


@dataclass
class NoSandbox:
    """--unsafe-no-sandbox: the same command, bare (the child's audit hook is the only fence)."""

    name: str = "no sandbox (--unsafe-no-sandbox)"

    def command(self, module: str, in_dir: Path, out_dir: Path, env: dict, work: Path,
                labkit_copy: Path | None = None) -> tuple[list[str], str]:
        """No mount: the stubs (labkit.grading.answers) are all that hides the answers here. The process runs
        under labkit/grading/keeper.py, which keeps what it detaches in its tree (as bwrap's PID namespace does)."""
        return ([sys.executable, "-I", str(KEEPER), sys.executable, "-m", module, str(in_dir), str(out_dir)],
                str(work / "scratch" / "cwd"))

    exit_code = staticmethod(exit_code)

    def scratch_for(self, work: Path) -> Path:
        for sub in SCRATCH_DIRS:
            (work / "scratch" / sub).mkdir(parents=True, exist_ok=True)
        return work / "scratch"


def make(protected: list[Path], gpu: bool, memory_mb: int, unsafe: bool, imports: bool = True) -> Bwrap | NoSandbox:
    """The sandbox to grade in: bubblewrap, checked to work here; NoSandbox only when `unsafe`."""
    if unsafe:
        return NoSandbox()
    exe = shutil.which("bwrap")
    if exe is None:
        raise SandboxError(f"bubblewrap (bwrap) is not installed, and the grader runs students' code only inside "
                           f"it: {INSTALL}")
    helptext = subprocess.run([exe, "--help"], capture_output=True, text=True, check=False).stdout
    features = tuple(f for f in ("--disable-userns", "--size") if f in helptext)
    extra = toolchain_paths()
    box = Bwrap(exe, read_only_paths(protected, extra), system_links(), gpu_devices() if gpu else [],
                tmp_mb=max(256, min(memory_mb // 2, 8192)), features=features)
    box.probe(imports)
    return box


def problem() -> str | None:
    """Why bubblewrap cannot sandbox the grader here (None: it can); a quick check, for tests and scripts."""
    try:
        make([], False, 512, unsafe=False, imports=False)
    except (SandboxError, OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    return None
