"""The house rules the README's layout section states, checked on the source (AST only, no
import): no import cycle between sub-packages, no private name imported from another module,
no module over the size limit, and no public function with more than 10 parameters."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "attnprobe"
MAX_MODULE_LINES = 410
MAX_PARAMETERS = 10


def modules() -> list[tuple[str, ast.Module, int]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        text = path.read_text(encoding="utf-8")
        found.append((name.removesuffix(".__init__"), ast.parse(text), text.count("\n")))
    return found


def imported(module: str, tree: ast.Module, is_package: bool) -> list[tuple[str, list[str]]]:
    """(target module, imported names) for every ``from ... import`` (in functions too)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level
                                        + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.append((target, [alias.name for alias in node.names]))
    return out


def sub_package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 else "attnprobe"


def test_no_import_cycle_between_sub_packages():
    edges = set()
    for module, tree, _ in modules():
        for target, _ in imported(module, tree, module.count(".") == 0):
            if target.startswith("attnprobe.") and sub_package(module) != "attnprobe":
                a, b = sub_package(module), sub_package(target)
                if a != b and b != "attnprobe":
                    edges.add((a, b))
    nodes = {n for edge in edges for n in edge}
    reach = {n: {b for a, b in edges if a == n} for n in nodes}
    for _ in nodes:  # transitive closure
        for n in nodes:
            reach[n] |= set(itertools.chain.from_iterable(reach[m] for m in reach[n]))
    cycles = sorted(n for n in nodes if n in reach[n])
    assert cycles == [], f"sub-packages in an import cycle: {cycles}"


def test_no_private_name_is_imported_from_another_module():
    private = []
    for module, tree, _ in modules():
        for target, names in imported(module, tree, False):
            if not target.startswith("attnprobe") or target == module:
                continue
            private += [f"{module}: {name} from {target}" for name in names
                        if name.startswith("_") and not name.startswith("__")]
    assert private == []


def test_no_module_is_over_the_size_limit():
    long = [(name, lines) for name, _, lines in modules() if lines > MAX_MODULE_LINES]
    assert long == [], f"split these modules (over {MAX_MODULE_LINES} lines): {long}"


def test_no_public_function_takes_more_than_ten_parameters():
    # the corpus signature plus options: wrappers hand a CorpusOptions on (issue 25)
    wide = []
    for module, tree, _ in modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                args = node.args
                names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
                count = len(names) - (names[:1] in (["self"], ["cls"]))
                if count > MAX_PARAMETERS:
                    wide.append(f"{module}.{node.name} ({count})")
    assert wide == []
