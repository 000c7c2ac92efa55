"""Fetch the wheels the lent GPU machine lacks (issue 31): ``make gpu-wheels``.

The lent machine (Python 3.12, x86-64, no network) has torch, transformers, accelerate, pandas,
scipy, matplotlib, tqdm, pyyaml and the rest of ``DEVICE_PACKAGES``, but not TRL, ``datasets``,
papermill, nbclient or ipykernel. This script downloads exactly those (``NEEDED``) and the
packages they need that the machine lacks, each at the version this environment has installed
(the project's ``requirements/lock.txt``), as cp312 manylinux x86-64 wheels, into ``WHEELS``
(ignored by git), checks that the wheels plus the working tree that travels with them stay under
the 64 MiB a device call carries, and prints the ``carry`` list and the command's first line.

    .venv/bin/python reproductions/gpu/gpu_wheels.py [--dry-run]

Which packages: the requirements of ``NEEDED`` read from this environment's installed metadata
(``importlib.metadata``), markers evaluated for CPython 3.12 on Linux x86-64, walked until a
package the machine has (not followed further: its own needs are the machine's business).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
WHEELS = ROOT / ".gpu-wheels"
"""where the wheels go (in .gitignore); a device call names it in ``carry``"""
LIMIT_MIB = 64
"""what one device call carries: the working tree (tracked and untracked-not-ignored files) plus
the carried paths"""
NEEDED = ("trl", "datasets", "papermill", "nbclient", "ipykernel")
"""what ``make gpu-check`` imports that the machine lacks (issue 31)"""
TARGET = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
          "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
          "implementation_name": "cpython", "platform_python_implementation": "CPython"}
"""the machine's interpreter, for requirement markers (Python 3.12.3 there)"""
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux1_x86_64")
# The packages of the device image (its package list as read on a machine running it on
# 2026-11-17; the issue names the main ones). Carried only for another version: none here.
DEVICE_PACKAGES = frozenset("""
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops
equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch
grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio iniconfig
interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13
nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir
onnxruntime onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix
orbax-checkpoint packaging pandas pathspec patsy peft pillow pip pluggy portalocker
prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing
pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers
setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton
typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray
xxhash yarl zipp""".split())


def norm(name: str) -> str:
    """PEP 503's normalised name: 'Jupyter_Client' -> 'jupyter-client'."""
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(needed=NEEDED, have=DEVICE_PACKAGES) -> dict[str, str]:
    """{package: installed version} of ``needed`` and what they need (markers evaluated for
    ``TARGET``, no extras), minus what the machine ``have``s; a needed package not installed
    here raises, naming it."""
    from packaging.requirements import Requirement

    out, todo = {}, [norm(n) for n in needed]
    while todo:
        name = todo.pop()
        if name in out or name in have:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            raise SystemExit(f"{name} is needed on the GPU machine but not installed here: "
                             f"`make setup` first") from None
        out[name] = dist.version
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({**TARGET, "extra": ""}):
                todo.append(norm(req.name))
    return dict(sorted(out.items()))


def travelling_tree_bytes(root: Path = ROOT) -> int:
    """Bytes of what a device call sends besides the carried paths: tracked files and untracked
    files git does not ignore."""
    def listed(*args):
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-z", *args], check=True,
                             capture_output=True).stdout.decode()
        return [p for p in out.split("\0") if p]
    files = set(listed()) | set(listed("--others", "--exclude-standard"))
    return sum((root / p).stat().st_size for p in files if (root / p).is_file())


def download(pins: dict[str, str], folder: Path = WHEELS) -> list[Path]:
    """``pip download`` each pinned wheel (no dependencies: the pins are the whole set) into a
    fresh ``folder``; returns the wheel files."""
    shutil.rmtree(folder, ignore_errors=True)  # one version of each: two stop the install there
    folder.mkdir(parents=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "--dest", str(folder)]
    cmd += [x for p in PLATFORMS for x in ("--platform", p)]
    subprocess.run(cmd + [f"{n}=={v}" for n, v in pins.items()], check=True)
    return sorted(folder.glob("*.whl"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="list the pins, download nothing")
    args = ap.parse_args(argv)
    pins = closure()
    print(f"{len(pins)} packages the GPU machine lacks: "
          + ", ".join(f"{n}=={v}" for n, v in pins.items()))
    if args.dry_run:
        return 0
    wheels = download(pins)
    got = {norm(w.name.split("-")[0]) for w in wheels}
    if got != set(pins):
        print(f"no wheel for: {sorted(set(pins) - got)}", file=sys.stderr)
        return 1
    mib = 2 ** 20
    whl, tree = sum(w.stat().st_size for w in wheels), travelling_tree_bytes()
    for w in wheels:
        print(f"  {w.stat().st_size / mib:6.2f} MiB  {w.name}")
    total = (whl + tree) / mib
    print(f"wheels {whl / mib:.1f} MiB + working tree {tree / mib:.1f} MiB = {total:.1f} MiB "
          f"of the {LIMIT_MIB} MiB a device call carries")
    if total >= LIMIT_MIB:
        print("over the limit: the device call would be refused", file=sys.stderr)
        return 1
    print(f'carry: ["{WHEELS.name}"]\ncommand: make gpu-check  (it installs {WHEELS.name}/*.whl '
          f"offline into a temporary folder first)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
