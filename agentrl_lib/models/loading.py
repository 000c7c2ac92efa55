"""Loading and saving causal LMs: by name or folder, the way any Hugging Face model is loaded.

``load_policy(name_or_path)`` takes
- ``agentrl/<size>`` (e.g. ``agentrl/tiny-64``): the project's tiny model, freshly initialised;
- a local folder written by ``save_pretrained`` (e.g. ``save_checkpoint`` below), or a hub name:
  ``AutoModelForCausalLM.from_pretrained`` and the matching tokenizer. Nothing is downloaded on
  this project's machines, but the path is the real one.
The named SFT bases (``agentrl-sft/<name>``) are built by SFT on first use:
``agentrl_lib.algorithms.sft.load_base`` resolves the name to its cached folder and loads it here.

``save_checkpoint`` writes a folder atomically (a temporary folder renamed into place), so a killed
build never leaves a half-written checkpoint that looks complete; ``cache_root`` is where the
project's built models live (``$AGENTRL_CACHE``, default ``~/.cache/agentrl``).

Every folder ``save_checkpoint`` or ``install_folder`` writes records the SHA-256 of each of its
files in ``CHECKSUMS`` (``write_checksums``); ``load_policy`` and the SFT cache
(``sft.checkpoint``, so ``agentrl cache``) check them (``checksum_problems``), so half a
``model.safetensors`` or flipped weight bytes are reported naming the file instead of loading.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

BUILTIN_PREFIX = "agentrl/"
SFT_PREFIX = "agentrl-sft/"


CHECKSUMS = "agentrl_checksums.json"
"""the file of a checkpoint folder that records {relative path: sha256} of every other file"""


class CorruptCheckpoint(ValueError):
    """A checkpoint folder whose files differ from the checksums recorded when it was written."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def file_checksums(folder: Path | str) -> dict[str, str]:
    """{path relative to ``folder``: sha256} of every file under it but ``CHECKSUMS``."""
    folder = Path(folder)
    return {p.relative_to(folder).as_posix(): _sha256(p) for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != CHECKSUMS}


def write_checksums(folder: Path | str) -> Path:
    """Record the checksum of every file of ``folder`` in ``folder/CHECKSUMS``."""
    path = Path(folder) / CHECKSUMS
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"sha256": file_checksums(folder)}, indent=1, sort_keys=True))
    os.replace(tmp, path)
    return path


def checksum_problems(folder: Path | str) -> list[str] | None:
    """None when ``folder`` records no checksums; else one line per recorded file that is missing
    or whose content changed (truncated, bytes flipped), naming it ([] when every file agrees)."""
    folder = Path(folder)
    try:
        recorded = json.loads((folder / CHECKSUMS).read_bytes().decode("utf-8"))["sha256"]
        assert isinstance(recorded, dict)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AssertionError):
        return [f"{folder / CHECKSUMS}: unreadable"]
    out = []
    for rel, digest in sorted(recorded.items()):
        path = folder / rel
        if not path.is_file():
            out.append(f"{path}: missing")
        elif _sha256(path) != digest:
            out.append(f"{path}: its checksum differs from the one recorded when it was written "
                       f"({path.stat().st_size} bytes now: truncated or changed)")
    return out


def verify_checkpoint(folder: Path | str) -> None:
    """Raise ``CorruptCheckpoint`` naming each file of ``folder`` that differs from its recorded
    checksum (a folder that records none passes)."""
    problems = checksum_problems(folder)
    if problems:
        raise CorruptCheckpoint(f"checkpoint {folder} is corrupt: " + "; ".join(problems))


def cache_root() -> Path:
    return Path(os.environ.get("AGENTRL_CACHE") or Path.home() / ".cache" / "agentrl")  # empty = unset


def is_plain_tokenizer(folder) -> bool:
    """True when ``folder`` holds a tokenizer saved as a plain ``tokenizers`` backend (the
    project's character and BPE tokenizers: ``tokenizer_class`` "TokenizersBackend" or
    "PreTrainedTokenizerFast"), to be loaded exactly as saved.

    Needed because transformers 5's ``AutoTokenizer`` rebuilds such a tokenizer from the model type
    in config.json (qwen2 -> Qwen's own pre-tokenizer), silently replacing ours: the character
    split's newlines vanish, the BPE's cross-word merges never fire, and the model sees token
    sequences it was never trained on.
    """
    path = Path(folder) / "tokenizer_config.json"
    if not (Path(folder) / "tokenizer.json").is_file() or not path.is_file():
        return False
    cls = json.loads(path.read_text()).get("tokenizer_class")
    return cls in ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_policy(name_or_path: str, device: str = "cpu", dtype=None, verify: bool = True,
                **builtin_kwargs):
    """Load a causal LM and its tokenizer (see the module docstring for the names it takes).

    ``builtin_kwargs`` go to ``tiny_lm.new_model`` for ``agentrl/<size>``. A missing folder, or a
    name that is neither a folder nor reachable on the hub, raises ``FileNotFoundError`` naming it;
    a folder whose files differ from its recorded checksums raises ``CorruptCheckpoint`` naming
    them (``verify=False``: the caller has just checked).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl_lib.models.tiny_lm import new_model

    if name_or_path.startswith(SFT_PREFIX):
        raise ValueError(f"{name_or_path!r} names an SFT base built on first use: load it with "
                         f"agentrl_lib.algorithms.sft.load_base({name_or_path!r})")
    if name_or_path.startswith(BUILTIN_PREFIX):
        model, tok = new_model(name_or_path[len(BUILTIN_PREFIX):], **builtin_kwargs)
        return model.to(device=device, dtype=dtype or torch.float32), tok
    path = Path(name_or_path).expanduser()
    looks_local = path.is_absolute() or name_or_path.startswith((".", "~")) or path.exists()
    if looks_local and not (path / "config.json").is_file():
        raise FileNotFoundError(f"no checkpoint at {path}: expected a folder with config.json "
                                f"(saved by save_pretrained)")
    if looks_local and verify:
        verify_checkpoint(path)
    try:
        if is_plain_tokenizer(path):
            from transformers import PreTrainedTokenizerFast

            tok = PreTrainedTokenizerFast.from_pretrained(name_or_path)
        else:
            tok = AutoTokenizer.from_pretrained(name_or_path)
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype or "auto")
    except OSError as e:
        raise FileNotFoundError(
            f"could not load {name_or_path!r} with from_pretrained: not a local checkpoint folder, "
            f"and the hub could not provide it ({str(e).splitlines()[0]})") from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return model.to(device), tok


def disable_dropout(model):
    """Set every dropout probability of ``model`` to 0, in place, and return it (TRL's
    ``trl.trainer.utils.disable_dropout_in_model``, which its trainers apply by default): the
    log-probs an RL loss compares, pi_theta against pi_old and a by-hand step against the
    library's, are then of one function. The project's bases have no dropout (nothing changes);
    a user's GPT-2 has 0.1, which breaks every equality check between two forward passes.

    >>> import torch
    >>> disable_dropout(torch.nn.Sequential(torch.nn.Dropout(0.1)))[0].p
    0.0
    """
    import torch

    for mod in model.modules():
        if isinstance(mod, torch.nn.Dropout):
            mod.p = 0.0
        if isinstance(getattr(mod, "attention_dropout", None), float):  # Llama, Qwen2 attention
            mod.attention_dropout = 0.0
    return model


def save_checkpoint(model, tokenizer, path: Path, meta: dict, meta_name: str = "agentrl_sft.json") -> Path:
    """Write model, tokenizer and ``meta`` (as ``meta_name``) to ``path`` atomically: into a temp
    folder first, renamed into place, so a killed build never leaves a half checkpoint."""
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / meta_name).write_text(json.dumps(meta, indent=2, default=list))
    write_checksums(tmp)
    shutil.rmtree(path, ignore_errors=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, path)
    return path


def install_folder(src: Path, path: Path) -> Path:
    """Copy the checkpoint folder ``src`` to ``path`` atomically (as ``save_checkpoint``), with
    its checksums: checked against ``src``'s when it records them, else recorded from the copy
    (the shipped bases live in git, which guards their bytes)."""
    path = Path(path)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    verify_checkpoint(src)
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    if not (tmp / CHECKSUMS).is_file():
        write_checksums(tmp)
    shutil.rmtree(path, ignore_errors=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.replace(tmp, path)
    return path
