"""Notebook discovery, the declared parameters, and the profiles that override them.

A notebook declares its parameters in the cell tagged ``parameters``, one annotated literal a line
with a help comment (``num_iters: int = 200  # training iterations``). Those values are the ``ci``
profile; ``reproductions/<notebook>/profiles.yaml`` holds the overrides of the other profiles.
Unlike papermill, which only warns, everything here refuses an unknown name or a wrong type.
"""

from __future__ import annotations

import ast
import io
import json
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

import yaml

PROFILES = ("ci", "cpu", "gpu")
RESERVED = {"seed": "use --seed (run) or --seeds (reproduce)", "profile": "use --profile"}
"""parameters the pipeline sets itself: refused in ``-p``, a profile or a grid, never ignored"""
TYPES = {"int": int, "float": float, "bool": bool, "str": str, "list": list, "dict": dict}


class PipelineError(Exception):
    """A user-facing error: bad notebook name, parameter, type or profile."""


@dataclass
class Param:
    name: str
    type: str
    default: object
    help: str = ""


@dataclass
class NotebookInfo:
    name: str
    path: Path
    meta: dict
    params: dict[str, Param]
    profiles: dict[str, dict] = field(default_factory=dict)

    @property
    def title(self) -> str:
        return self.meta.get("title") or self.name


def repo_root(start: Path | None = None) -> Path:
    """The folder holding ``notebooks/``: the current directory or one above it, else the
    checkout this package was installed from (editable install)."""
    here = (start or Path.cwd()).resolve()
    for p in [here, *here.parents]:
        if (p / "notebooks").is_dir() and (p / "agentrl_lib").is_dir():
            return p
    pkg_root = Path(__file__).resolve().parents[2]
    if (pkg_root / "notebooks").is_dir():
        return pkg_root
    raise PipelineError("cannot find the agentrl checkout (a folder with notebooks/ and "
                        "agentrl_lib/); run agentrl from inside it")


def notebook_paths(root: Path) -> list[Path]:
    return sorted(p for p in (root / "notebooks").glob("*.ipynb") if not p.name.startswith("."))


def find_notebook(name: str, root: Path) -> Path:
    """Accepts the stem ('01_mdp_dynamic_programming'), a unique prefix ('01'), or a path."""
    p = Path(name)
    if p.suffix == ".ipynb" and p.is_file():
        return p.resolve()
    paths = notebook_paths(root)
    exact = [q for q in paths if q.stem == name]
    if exact:
        return exact[0]
    prefix = [q for q in paths if q.stem.startswith(name)]
    if len(prefix) == 1:
        return prefix[0]
    known = ", ".join(q.stem for q in paths) or "(none)"
    if len(prefix) > 1:
        raise PipelineError(f"notebook {name!r} is ambiguous: {', '.join(q.stem for q in prefix)}")
    raise PipelineError(f"unknown notebook {name!r}; known notebooks: {known}")


def parameters_source(nb: dict) -> str:
    for cell in nb.get("cells", []):
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            src = cell["source"]
            return "".join(src) if isinstance(src, list) else src
    raise PipelineError("the notebook has no cell tagged 'parameters'")


def parse_parameters(source: str) -> dict[str, Param]:
    """Parse ``name: type = literal  # help`` lines (a bare ``name = literal`` infers the type).
    A cell that is not valid Python raises PipelineError naming the line."""
    try:
        tree = ast.parse(source)
        comments = {}
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                comments[tok.start[0]] = tok.string.lstrip("#").strip()
    except (SyntaxError, tokenize.TokenError) as e:
        line = getattr(e, "lineno", None) or (e.args[1][0] if len(e.args) > 1 else "?")
        msg = getattr(e, "msg", None) or e.args[0]
        raise PipelineError(f"parameters cell line {line}: not valid Python ({msg})") from None
    params: dict[str, Param] = {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name, tname = node.target.id, ast.unparse(node.annotation)
            value = node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(
                node.targets[0], ast.Name):
            name, tname, value = node.targets[0].id, None, node.value
        else:
            raise PipelineError(f"parameters cell line {node.lineno}: only `name: type = literal` "
                                f"assignments are allowed")
        try:
            default = ast.literal_eval(value)
        except ValueError:
            raise PipelineError(f"parameter {name!r}: the default must be a literal") from None
        tname = tname or type(default).__name__
        if tname not in TYPES:
            raise PipelineError(f"parameter {name!r}: type {tname!r} is not one of {list(TYPES)}")
        params[name] = Param(name, tname, check_value(name, tname, default),
                             comments.get(node.lineno, ""))
    return params


def check_value(name: str, tname: str, value):
    """Return ``value`` as type ``tname`` or raise naming the parameter. An int is a valid float;
    a bool is not a valid int."""
    if tname == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    want = TYPES[tname]
    if isinstance(value, bool) and tname != "bool":
        ok = False
    else:
        ok = isinstance(value, want)
    if not ok:
        raise PipelineError(f"parameter {name!r} expects {tname}, got {value!r} "
                            f"({type(value).__name__})")
    return value


def parse_cli_value(name: str, tname: str, text: str):
    """Convert the string given on the command line (``-p NAME VALUE``) to the declared type."""
    try:
        if tname == "int":
            return int(text)
        if tname == "float":
            return float(text)
        if tname == "bool":
            low = text.lower()
            if low in ("true", "1", "yes"):
                return True
            if low in ("false", "0", "no"):
                return False
            raise ValueError
        if tname == "str":
            return text
        value = yaml.safe_load(text)
        return check_value(name, tname, value)
    except (ValueError, yaml.YAMLError):
        raise PipelineError(f"parameter {name!r} expects {tname}, got {text!r}") from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping (PyYAML keeps the last
    one silently, so a profile or grid could run with a value nobody meant)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                dup = key in seen
            except TypeError:  # an unhashable key: the base class says so
                break
            if dup:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def read_yaml(path: Path | str):
    """The parsed YAML file; a malformed one (bad syntax, a key given twice, bytes that are not
    UTF-8) raises PipelineError naming the file, the line and column, and what is wrong (never a
    parser traceback)."""
    try:
        return yaml.load(Path(path).read_bytes().decode("utf-8"), Loader=_UniqueKeyLoader)
    except UnicodeDecodeError as e:
        raise PipelineError(f"{path}: not UTF-8 text (byte {e.start}: "
                            f"{e.object[e.start:e.start + 1]!r})") from None
    except OSError as e:
        raise PipelineError(f"{path}: cannot read it ({e.strerror or e})") from None
    except yaml.YAMLError as e:
        mark, context = getattr(e, "problem_mark", None), getattr(e, "context", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else f"{path}"
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        if context:
            start = getattr(e, "context_mark", None)
            problem += f" ({context}{f' that starts at line {start.line + 1}' if start else ''})"
        raise PipelineError(f"{where}: malformed YAML: {problem}") from None


def load_profiles(root: Path, name: str, params: dict[str, Param]) -> dict[str, dict]:
    path = root / "reproductions" / name / "profiles.yaml"
    profiles = {"ci": {}}
    if path.is_file():
        data = read_yaml(path) or {}
        if not isinstance(data, dict):
            raise PipelineError(f"{path}: profiles are a mapping profile -> {{parameter: value}}")
        for prof, overrides in data.items():
            if prof not in PROFILES:
                raise PipelineError(f"{path}: unknown profile {prof!r}; expected one of {PROFILES}")
            if not isinstance(overrides or {}, dict):
                raise PipelineError(f"{path} [{prof}]: expected a mapping parameter -> value")
            for reserved in RESERVED:
                if reserved in (overrides or {}):
                    raise PipelineError(f"{path} [{prof}]: {reserved!r} is not a profile "
                                        f"setting; {RESERVED[reserved]}")
            profiles[prof] = validate_overrides(overrides or {}, params, f"{path} [{prof}]")
    return profiles


def validate_overrides(overrides: dict, params: dict[str, Param], where: str) -> dict:
    out = {}
    for k, v in overrides.items():
        if k not in params:
            raise PipelineError(f"{where}: unknown parameter {k!r}; this notebook declares: "
                                f"{', '.join(params)}")
        try:
            out[k] = check_value(k, params[k].type, v)
        except PipelineError as e:
            raise PipelineError(f"{where}: {e}") from None
    return out


def read_notebook(path: Path) -> dict:
    """The notebook's JSON; an unreadable, truncated or non-UTF-8 file raises PipelineError
    naming it."""
    try:
        nb = json.loads(Path(path).read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise PipelineError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise PipelineError(f"{path}: not a notebook: invalid JSON at line {e.lineno} column "
                            f"{e.colno} ({e.msg}; truncated?)") from None
    except OSError as e:
        raise PipelineError(f"{path}: cannot read it ({e.strerror or e})") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise PipelineError(f"{path}: not a notebook (no list of cells)")
    return nb


def load_notebook(path: Path, root: Path) -> NotebookInfo:
    nb = read_notebook(path)
    try:
        params = parse_parameters(parameters_source(nb))
    except PipelineError as e:
        raise PipelineError(f"{path}: {e}") from None
    info = NotebookInfo(path.stem, path, nb.get("metadata", {}).get("agentrl", {}), params)
    info.profiles = load_profiles(root, path.stem, params)
    return info


def resolve_params(info: NotebookInfo, profile: str, seed: int,
                   cli: list[tuple[str, str]] | None = None, overrides: dict | None = None) -> dict:
    """ci defaults, then the profile's overrides, then a grid point's ``overrides`` (typed
    values), then ``-p`` values (text); ``seed`` and ``profile`` are set last. Every name and type
    is checked."""
    if profile not in PROFILES:
        raise PipelineError(f"unknown profile {profile!r}; expected one of {PROFILES}")
    if profile not in info.profiles:
        raise PipelineError(f"{info.name} has no {profile!r} profile; it has: "
                            f"{', '.join(info.profiles)}")
    params = {k: p.default for k, p in info.params.items()}
    params.update(info.profiles[profile])
    params.update(validate_overrides(overrides or {}, info.params, f"{info.name} grid point"))
    for name, text in cli or []:
        if name in RESERVED:
            raise PipelineError(f"-p {name} {text}: {RESERVED[name]}")
        if name not in info.params:
            raise PipelineError(f"unknown parameter {name!r} for {info.name}; it declares: "
                                f"{', '.join(info.params)}")
        params[name] = parse_cli_value(name, info.params[name].type, text)
    for required in ("seed", "profile"):
        if required not in info.params:
            raise PipelineError(f"{info.name} does not declare the parameter {required!r}")
    params["seed"], params["profile"] = int(seed), profile
    return params
