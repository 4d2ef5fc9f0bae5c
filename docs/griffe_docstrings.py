"""Griffe extension: read attnprobe's docstrings the way they are written.

The code writes Google-style sections with a singular ``Example:`` heading, which Griffe's
Google parser knows only as ``Examples:`` (else it renders the ``>>>`` lines as Markdown block
quotes), and cross-references as Sphinx roles (``:func:`extract```, ``:class:`~a.b.C```),
which Markdown shows literally. This extension rewrites both in Griffe's copy of each
docstring (the code is untouched): ``Example:`` becomes ``Examples:``, a role becomes its
target in code (``~`` keeps the last name, as Sphinx does).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import griffe

EXAMPLE_HEADING = re.compile(r"^(\s*)Example:\s*$", re.M)
ARGS_HEADING = re.compile(r"^(\s*)(?:Args|Arguments|Parameters|Keyword Args):\s*$")
# an argument entry naming several parameters: "model_a / model_b: ..." or "x, y: ..."
GROUPED = re.compile(r"^(\s+)(\*{0,2}\w+(?:\s*(?:/|,)\s*\*{0,2}\w+)+):(.*)$")
ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|obj|exc|const):`(~?)([^`]+)`")


def _role(found: re.Match[str]) -> str:
    short, target = found.groups()
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


def split_grouped(text: str) -> str:
    """``text`` with each argument entry that names several parameters (``a / b: ...``,
    ``a, b: ...``) given once per parameter, with its description, so that every entry names
    a parameter of the signature (Griffe checks that) and each parameter has its row."""
    lines, out, section = text.splitlines(), [], None
    i = 0
    while i < len(lines):
        line = lines[i]
        heading = ARGS_HEADING.match(line)
        if heading:
            section = len(heading.group(1))
        elif line.strip() and section is not None and len(line) - len(line.lstrip()) <= section:
            section = None
        found = GROUPED.match(line) if section is not None else None
        if not found:
            out.append(line)
            i += 1
            continue
        indent, names, rest = found.groups()
        body = [rest]
        i += 1
        while i < len(lines) and (not lines[i].strip() or
                                  len(lines[i]) - len(lines[i].lstrip()) > len(indent)):
            body.append(lines[i])
            i += 1
        blank = []
        while len(body) > 1 and not body[-1].strip():
            blank.append(body.pop())
        for name in re.split(r"\s*[/,]\s*", names):
            out.append(f"{indent}{name}:{body[0]}")
            out.extend(body[1:])
        out.extend(blank)
    return "\n".join(out)


def rewrite(text: str) -> str:
    """``text`` with ``Example:`` headings as ``Examples:``, grouped argument entries split
    and Sphinx roles as code."""
    return ROLE.sub(_role, split_grouped(EXAMPLE_HEADING.sub(r"\1Examples:", text)))


class AttnprobeDocstrings(griffe.Extension):
    """Rewrites every docstring once the object tree is built (before it is parsed)."""

    def on_object(self, *, obj: griffe.Object, **_: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value)


class NamespaceSubpackages(griffe.Extension):
    """Loads ``attnprobe/core/`` (a folder without ``__init__.py``, which Python imports as a
    namespace subpackage but Griffe skips) so that ``::: attnprobe.core.scope`` resolves.

    Uses the loader's private ``_load_submodule`` (griffelib is pinned in constraints.txt);
    an ``attnprobe/core/__init__.py`` would make this class unnecessary.
    """

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **_: Any) -> None:
        root = Path(str(pkg.filepath)).parent
        for folder in sorted(path for path in root.iterdir() if path.is_dir()):
            if (folder / "__init__.py").exists() or folder.name in pkg.members:
                continue
            modules = sorted(folder.glob("*.py"))
            if not modules:
                continue
            pkg.set_member(folder.name, griffe.Module(folder.name, filepath=[folder], parent=pkg))
            for path in modules:
                loader._load_submodule(pkg, (folder.name, path.stem), path)
