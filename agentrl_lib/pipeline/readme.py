"""The README's generated parts: the notebook map (from each notebook's ``metadata.agentrl``) and
the library layout (from each module's docstring), each between ``<!-- NAME:start ... -->`` and
``<!-- NAME:end -->``. ``agentrl readme`` rewrites them; ``tests/test_notebooks_clean.py`` fails
when one is stale, so neither is kept by hand.
"""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path

from agentrl_lib.pipeline.notebooks import load_notebook, notebook_paths

# a sentence ends at a full stop before a capital, a backtick or a parenthesis, except after
# "et al.", "e.g.", "i.e." and "Dr." (citations, examples, Dr. GRPO and Dr. MAS)
_SENTENCE_END = re.compile(r"(?<!\bal)(?<!\be\.g)(?<!\bi\.e)(?<!\bDr)\.\s+(?=[A-Z`(])")
NAME_WIDTH = 24
"""the layout's first column (``    value_targets.py`` and two spaces); text wraps at 100"""


def notebook_map(root: Path) -> str:
    """The markdown table notebook -> paper -> library modules -> claim (``agentrl list
    --markdown``)."""
    lines = ["| notebook | paper | library modules | claim checked |", "|---|---|---|---|"]
    for path in notebook_paths(root):
        info = load_notebook(path, root)
        m = info.meta
        paper = f"[{m.get('paper', '')}]({m['url']})" if m.get("url") else m.get("paper", "")
        mods = ", ".join(f"`{x}`" for x in m.get("modules", []))
        lines.append(f"| [{info.name}](notebooks/{path.name}): {info.title} | {paper} | {mods} | "
                     f"{m.get('claim', '')} |")
    return "\n".join(lines) + "\n"


def summary(path: Path) -> str:
    """The first sentence of a module's docstring, on one line, without its full stop (and
    without the reST double backticks, which a code block would show)."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    para = " ".join(doc.split("\n\n")[0].split())
    return _SENTENCE_END.split(para)[0].rstrip(".").replace("``", "")


def layout(root: Path) -> str:
    """The package tree of ``agentrl_lib/`` (modules, then packages, each alphabetically) with each
    module's and package's summary, as a code block wrapped at 100 characters."""
    pkg = root / "agentrl_lib"
    lines = ["```", "agentrl_lib/"]

    def entry(name: str, depth: int, text: str):
        head = f"{'  ' * depth}{name}".ljust(NAME_WIDTH - 1) + " "
        lines.extend(textwrap.wrap(text, 100, initial_indent=head,
                                   subsequent_indent=" " * NAME_WIDTH) or [head.rstrip()])

    def walk(folder: Path, depth: int):
        files = sorted(p for p in folder.glob("*.py") if p.name != "__init__.py")
        subs = sorted(p for p in folder.iterdir() if (p / "__init__.py").is_file())
        for p in files:
            entry(p.name, depth, summary(p))
        for p in subs:
            entry(p.name + "/", depth, summary(p / "__init__.py"))
            walk(p, depth + 1)

    walk(pkg, 1)
    return "\n".join(lines + ["```"]) + "\n"


def generated_parts(root: Path) -> dict[str, str]:
    return {"map": notebook_map(root), "layout": layout(root)}


def fill(text: str, parts: dict[str, str]) -> str:
    """``text`` with the lines between each part's start and end markers replaced by the part."""
    for name, body in parts.items():
        start = text.index(f"<!-- {name}:start")
        start = text.index("\n", start) + 1
        end = text.index(f"<!-- {name}:end -->", start)
        text = text[:start] + body + text[end:]
    return text
