"""How far one backward pass moves when torch's CPU kernels change: the default kernel set against
AVX2 (``ATEN_CPU_CAPABILITY=avx2``), and one thread against two. Why a committed table repeats bit
for bit only on the machine kind that made it (README, "The pipeline": bit for bit, on the same
kernels).

Each setting runs in its own process (the kernel set is fixed at import): the shipped key-door base
(keydoor-agent-bpe), one batch of random token ids, the summed log-prob of one token id, backward;
the flat gradient is compared with the default run's. Usage:

    python reproductions/benchmarks/kernel_rounding.py [--batch 64] [--length 300] [--out FILE.md]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BASE = "keydoor-agent-bpe"


def gradient(out: str, threads: int, batch: int, length: int) -> None:
    """Child process: write the flat gradient and the kernel set in use to ``out``."""
    import torch

    torch.set_num_threads(threads)
    from agentrl_lib.algorithms.sft import load_base

    model, _ = load_base(BASE, verbose=False)  # eval mode: no dropout, so the pass is repeatable
    x = torch.randint(0, 200, (batch, length), generator=torch.Generator().manual_seed(0))
    model(x).logits.log_softmax(-1)[..., 5].sum().backward()
    flat = torch.cat([p.grad.flatten() for p in model.parameters()])
    torch.save({"grad": flat, "kernels": torch.backends.cpu.get_cpu_capability()}, out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--length", type=int, default=300)
    ap.add_argument("--out", default=str(Path(__file__).with_suffix(".md")))
    ap.add_argument("--child", nargs=2, metavar=("OUT", "THREADS"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return gradient(a.child[0], int(a.child[1]), a.batch, a.length)
    import torch

    settings = {"default kernels, 1 thread": ({}, 1), "default kernels, 1 thread (again)": ({}, 1),
                "default kernels, 2 threads": ({}, 2),
                "AVX2 kernels, 1 thread": ({"ATEN_CPU_CAPABILITY": "avx2"}, 1)}
    got = {}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, (env, threads)) in enumerate(settings.items()):
            out = os.path.join(tmp, f"{i}.pt")
            subprocess.run([sys.executable, __file__, "--child", out, str(threads),
                            "--batch", str(a.batch), "--length", str(a.length)],
                           env={**os.environ, **env}, check=True, capture_output=True)
            got[name] = torch.load(out)
    ref = got["default kernels, 1 thread"]["grad"]
    rows = ["| setting | kernels | bit-identical | max abs difference | largest entry | relative |",
            "| --- | --- | --- | --- | --- | --- |"]
    for name, g in list(got.items())[1:]:
        d = (g["grad"] - ref).abs().max().item()
        big = ref.abs().max().item()
        rows.append(f"| {name} | {g['kernels']} | {torch.equal(g['grad'], ref)} | {d:.3g} | "
                    f"{big:.3g} | {d / big:.2g} |")
    text = "\n".join([
        "# One backward pass under other CPU kernels (reproductions/benchmarks/kernel_rounding.py)",
        "",
        f"The shipped {BASE} base, one batch of {a.batch} x {a.length} random token ids, the summed "
        "log-prob of one token id; each setting's flat gradient against the default kernels at "
        f"one thread ({got['default kernels, 1 thread']['kernels']} on this machine), each in its "
        "own process.", "", *rows, "",
        "Same kernels, same thread count: the same bits (the first row). Another kernel set or "
        "thread count: the last bits differ, and an RL run that samples from the updated policy "
        "then follows another trajectory. Rerun: `.venv/bin/python "
        "reproductions/benchmarks/kernel_rounding.py` (under a minute).", ""])
    Path(a.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
