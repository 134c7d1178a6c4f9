"""The package's layout rules, checked on the source of every ``hvd_partial``
module (by parsing it, nothing is imported):

(a) No import cycles among hvd_partial modules. Every ``import`` counts,
    function-level ones included; those under ``if TYPE_CHECKING:`` do not
    (they never run). An import's edges: ``from B import n`` leads to ``B.n``
    when that is a module, and to ``B`` (its ``__init__``) when ``n`` is a
    name defined there or when ``B`` is not a package the importer lives in
    (an enclosing package is already being initialised, so
    ``from . import sibling`` reaches only the sibling). ``import a.b`` leads
    to ``a.b`` and to each of its packages the importer is not inside. A
    package ``__init__`` that re-exports its submodules therefore has an edge
    to each of them, and a submodule that reads a name back from that
    ``__init__`` closes a cycle.
(b) No module imports a ``_private`` name of another module
    (``from .a import _b``); a private *submodule* may be imported.
(c) No module reads or writes a ``_private`` attribute that belongs to another
    module. An attribute belongs to a module when it is read on an imported
    hvd_partial module (``exchange._builder`` after ``from . import
    exchange``, ``hvd_partial.api._post`` after ``import hvd_partial.api``),
    or when the name is defined only in other modules: a class
    there assigns ``self._name``/``cls._name`` or has ``_name`` in its body,
    and no class of the reading module does. Access through ``self``,
    ``cls`` and ``super()`` is a class's own business and is not checked;
    neither are dunders, nor names that no hvd_partial module defines (third
    party privates). ``getattr``/``setattr``/``hasattr`` with a constant name
    count as attribute access.
(d) No class has more than :data:`MAX_METHODS` methods (``def``s directly in
    its body, properties and static methods included).

Exemptions are listed below, each with its reason. The checker's own tests
build small synthetic packages that break each rule.
"""

from __future__ import annotations

import ast
import pathlib
from dataclasses import dataclass

import pytest

import hvd_partial

PACKAGE = pathlib.Path(hvd_partial.__file__).parent
MAX_METHODS = 30

# class (module:qualified name) -> reason it may have more than MAX_METHODS methods
METHOD_COUNT_EXEMPT: dict[str, str] = {}

# (importer, imported) -> reason this edge is left out of the cycle check
IMPORT_EDGE_EXEMPT = {
    ("hvd_partial.tensorflow", "hvd_partial.keras.optimizer"):
        "Horovod's hvd.tensorflow.DistributedOptimizer, imported in the module __getattr__ on first use only",
}


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` except what sits under ``if TYPE_CHECKING:`` (its ``else`` still runs)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            stack.append(node.test)
            continue
        stack.extend(ast.iter_child_nodes(node))


@dataclass
class Module:
    name: str
    path: pathlib.Path
    is_package: bool
    tree: ast.Module


def load_package(root: pathlib.Path, package: str) -> dict[str, Module]:
    """Every module under ``root`` (the directory of package ``package``), by dotted name."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        name = ".".join([package, *parts])
        modules[name] = Module(name, path, is_package, ast.parse(path.read_text(), str(path)))
    return modules


def _base_of(module: Module, node: ast.ImportFrom) -> str:
    """The absolute module that ``from ... import`` names at ``node``."""
    if node.level == 0:
        return node.module or ""
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _encloses(package: str, module: Module) -> bool:
    """True when ``package`` is ``module``'s package or one above it (already initialising when it runs)."""
    return module.name.startswith(package + ".") or (module.is_package and module.name == package)


def import_edges(modules: dict[str, Module]) -> dict[str, list[tuple[str, int]]]:
    """For each module, the package modules its runtime imports lead to, with the line of each."""
    edges = {}
    for module in modules.values():
        found = []
        for node in _runtime_nodes(module.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    for i in range(1, len(parts) + 1):
                        target = ".".join(parts[:i])
                        if target in modules and (i == len(parts) or not _encloses(target, module)):
                            found.append((target, node.lineno))
            elif isinstance(node, ast.ImportFrom):
                base = _base_of(module, node)
                if base not in modules:
                    continue
                names_a_module_only = True
                for alias in node.names:
                    if f"{base}.{alias.name}" in modules:
                        found.append((f"{base}.{alias.name}", node.lineno))
                    else:
                        names_a_module_only = False
                if not names_a_module_only or not _encloses(base, module):
                    found.append((base, node.lineno))
        edges[module.name] = [(t, line) for t, line in found if t != module.name]
    return edges


def import_cycles(modules: dict[str, Module], exempt=frozenset()) -> list[str]:
    """One line per import cycle (a strongly connected group of modules), naming the imports that close it;
    ``exempt``: (importer, imported) edges left out."""
    edges = {name: [(t, line) for t, line in found if (name, t) not in exempt]
             for name, found in import_edges(modules).items()}
    index, low, on_stack, stack, groups = {}, {}, set(), [], []

    def visit(name: str) -> None:  # Tarjan's strongly connected components
        index[name] = low[name] = len(index)
        stack.append(name)
        on_stack.add(name)
        for target, _ in edges[name]:
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in on_stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == name:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for name in sorted(modules):
        if name not in index:
            visit(name)
    lines = []
    for group in groups:
        inside = sorted({f"{a} -> {b} (line {line})" for a in group for b, line in edges[a] if b in group})
        lines.append(f"cycle among {', '.join(group)}: " + "; ".join(inside))
    return lines


def private_name_imports(modules: dict[str, Module]) -> list[str]:
    """``from .a import _b`` of another module's private name (a private submodule is fine)."""
    found = []
    for module in modules.values():
        for node in _runtime_nodes(module.tree):
            if isinstance(node, ast.ImportFrom):
                base = _base_of(module, node)
                if base not in modules or base == module.name:
                    continue
                for alias in node.names:
                    if _is_private(alias.name) and f"{base}.{alias.name}" not in modules:
                        found.append(f"{module.name} line {node.lineno}: imports {alias.name} from {base}")
    return found


def _module_aliases(module: Module, modules: dict[str, Module]) -> dict[str, str]:
    """Local names that ``module`` binds to other package modules by importing them."""
    aliases = {}
    for node in ast.walk(module.tree):
        if isinstance(node, ast.ImportFrom):
            base = _base_of(module, node)
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    aliases[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname and alias.name in modules:
                    aliases[alias.asname] = alias.name
                elif not alias.asname and alias.name.split(".")[0] in modules:
                    aliases[alias.name.split(".")[0]] = alias.name.split(".")[0]  # import a.b binds a
    return aliases


def _module_named(value: ast.expr, aliases: dict[str, str], modules: dict[str, Module]) -> str | None:
    """The package module that ``value`` names (``alias`` or ``alias.sub.mod``), if any."""
    if isinstance(value, ast.Name):
        return aliases.get(value.id)
    if isinstance(value, ast.Attribute):
        parent = _module_named(value.value, aliases, modules)
        if parent is not None and f"{parent}.{value.attr}" in modules:
            return f"{parent}.{value.attr}"
    return None


def _defined_private_attributes(module: Module) -> set[str]:
    """Private attribute names that classes of ``module`` define: ``self._x = ...``/``cls._x = ...`` or ``_x`` in a class body."""
    defined = set()
    for node in ast.walk(module.tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    defined.add(item.name)
                elif isinstance(item, (ast.Assign, ast.AnnAssign)):
                    for target in item.targets if isinstance(item, ast.Assign) else [item.target]:
                        if isinstance(target, ast.Name):
                            defined.add(target.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                defined.add(node.attr)
    return {name for name in defined if _is_private(name)}


def _is_own(value: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``: a class reaching its own attributes."""
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls")
    return isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "super"


def _attribute_accesses(tree: ast.AST):
    """(object expression, attribute name, line) for ``obj.name`` and ``getattr(obj, "name")``-style accesses."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            yield node.value, node.attr, node.lineno
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
            yield node.args[0], node.args[1].value, node.lineno


def foreign_private_attributes(modules: dict[str, Module]) -> list[str]:
    """Accesses of private attributes that belong to another module (rule (c) in this file's docstring)."""
    defined = {name: _defined_private_attributes(m) for name, m in modules.items()}
    found = []
    for module in modules.values():
        aliases = _module_aliases(module, modules)
        for value, attr, line in _attribute_accesses(module.tree):
            if not _is_private(attr) or _is_own(value):
                continue
            named = _module_named(value, aliases, modules)
            if named is not None:
                found.append(f"{module.name} line {line}: {ast.unparse(value)}.{attr} reads a private name of {named}")
                continue
            if attr in defined[module.name]:
                continue
            owners = sorted(name for name, names in defined.items() if attr in names)
            if owners:
                found.append(f"{module.name} line {line}: {ast.unparse(value)}.{attr} reads a private attribute "
                             f"defined in {', '.join(owners)}")
    return found


def oversized_classes(modules: dict[str, Module], exempt: dict[str, str]) -> list[str]:
    found = []
    for module in modules.values():
        def visit(body, prefix):
            for node in body:
                if isinstance(node, ast.ClassDef):
                    qualified = f"{prefix}{node.name}"
                    methods = sum(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in node.body)
                    if methods > MAX_METHODS and f"{module.name}:{qualified}" not in exempt:
                        found.append(f"{module.name}:{qualified} has {methods} methods (at most {MAX_METHODS})")
                    visit(node.body, qualified + ".")
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    visit(node.body, f"{prefix}{node.name}.<locals>.")
                elif isinstance(node, (ast.If, ast.Try, ast.With)):
                    visit(getattr(node, "body", []) + getattr(node, "orelse", []), prefix)
        visit(module.tree.body, "")
    return found


# -- the package itself

@pytest.fixture(scope="module")
def package_modules():
    return load_package(PACKAGE, "hvd_partial")


def test_no_import_cycles(package_modules):
    cycles = import_cycles(package_modules, IMPORT_EDGE_EXEMPT)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_no_private_name_imports(package_modules):
    found = private_name_imports(package_modules)
    assert not found, "private names imported from other modules:\n" + "\n".join(found)


def test_no_foreign_private_attribute_reads(package_modules):
    found = foreign_private_attributes(package_modules)
    assert not found, "private attributes of other modules read:\n" + "\n".join(found)


def test_classes_stay_small(package_modules):
    found = oversized_classes(package_modules, METHOD_COUNT_EXEMPT)
    assert not found, "classes over the method limit:\n" + "\n".join(found)


def test_exemptions_still_apply(package_modules):
    """An exemption that no longer applies (class gone or shrunk, import gone) is dropped, not kept around."""
    oversized = set(line.split(" ")[0] for line in oversized_classes(package_modules, {}))
    assert set(METHOD_COUNT_EXEMPT) <= oversized, set(METHOD_COUNT_EXEMPT) - oversized
    edges = {(name, target) for name, found in import_edges(package_modules).items() for target, _ in found}
    assert set(IMPORT_EDGE_EXEMPT) <= edges, set(IMPORT_EDGE_EXEMPT) - edges


# -- the checker, on synthetic packages that break each rule

def _write_package(root: pathlib.Path, files: dict[str, str]) -> dict[str, Module]:
    for relative, text in files.items():
        path = root / "pkg" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return load_package(root / "pkg", "pkg")


def test_checker_finds_a_function_level_cycle(tmp_path):
    modules = _write_package(tmp_path, {
        "__init__.py": "",
        "a.py": "from . import b\n",
        "b.py": "def later():\n    from .a import thing\n",
        "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import thing\n",
    })
    [cycle] = import_cycles(modules)
    assert "pkg.a, pkg.b" in cycle and "pkg.b -> pkg.a (line 2)" in cycle
    assert "pkg.c" not in cycle  # under TYPE_CHECKING: no edge
    assert import_cycles(modules, {("pkg.b", "pkg.a")}) == []


def test_checker_finds_a_cycle_through_a_re_exporting_init(tmp_path):
    modules = _write_package(tmp_path, {
        "__init__.py": "",
        "sub/__init__.py": "from .x import X\nfrom .y import Y\n",
        "sub/x.py": "X = 1\n",
        "sub/y.py": "from . import x\nfrom . import X\nY = 2\n",  # the module is fine, the name from __init__ is not
    })
    [cycle] = import_cycles(modules)
    assert cycle.startswith("cycle among pkg.sub, pkg.sub.y:"), cycle
    assert "pkg.sub.y -> pkg.sub (line 2)" in cycle and "line 1" not in cycle.split("pkg.sub.y ->")[1]


def test_checker_sibling_imports_through_a_re_exporting_init_are_no_cycle(tmp_path):
    modules = _write_package(tmp_path, {
        "__init__.py": "from .a import A\nfrom .b import B\n",
        "a.py": "from . import b\nfrom .b import B as A\nimport pkg.b\n",
        "b.py": "B = 1\n",
    })
    assert import_cycles(modules) == []


def test_checker_finds_private_name_imports(tmp_path):
    modules = _write_package(tmp_path, {
        "__init__.py": "from ._env import setup\n",
        "_env.py": "def setup(): pass\n",
        "a.py": "_helper = 1\n",
        "b.py": "from .a import _helper\nfrom . import _env\n",
    })
    assert private_name_imports(modules) == ["pkg.b line 1: imports _helper from pkg.a"]


def test_checker_finds_foreign_private_attributes(tmp_path):
    modules = _write_package(tmp_path, {
        "__init__.py": "",
        "a.py": ("class Rounds:\n    def __init__(self):\n        self._stacked = []\n"
                 "    def merge(self, other):\n        return self._stacked + other._stacked\n"
                 "_builder = None\n"),
        "b.py": ("from . import a\nimport third_party\n"
                 "class Mine:\n    def __init__(self):\n        self._own = 1\n"
                 "def use(rounds, mine):\n"
                 "    a._builder\n"
                 "    rounds._stacked\n"
                 "    getattr(rounds, '_stacked')\n"
                 "    mine._own\n"
                 "    third_party._internal\n"
                 "    rounds.__class__\n"
                 "    import pkg.a\n"
                 "    pkg.a._builder\n"),
    })
    assert foreign_private_attributes(modules) == [
        "pkg.b line 7: a._builder reads a private name of pkg.a",
        "pkg.b line 8: rounds._stacked reads a private attribute defined in pkg.a",
        "pkg.b line 9: rounds._stacked reads a private attribute defined in pkg.a",
        "pkg.b line 14: pkg.a._builder reads a private name of pkg.a",
    ]


def test_checker_finds_oversized_classes(tmp_path):
    methods = "".join(f"    def m{i}(self): pass\n" for i in range(MAX_METHODS))
    modules = _write_package(tmp_path, {
        "__init__.py": "",
        "a.py": (f"class Fits:\n{methods}"
                 f"class TooBig:\n{methods}    @property\n    def one_more(self): pass\n"
                 f"class Known(TooBig):\n{methods}    def extra(self): pass\n"),
    })
    assert oversized_classes(modules, {"pkg.a:Known": "test"}) == [
        f"pkg.a:TooBig has {MAX_METHODS + 1} methods (at most {MAX_METHODS})"]


def test_test_files_have_unique_names():
    # The test folders are not packages: pytest imports each test file by its bare name, so two
    # files of one name in two folders stop the whole collection.
    tests = pathlib.Path(__file__).resolve().parents[1]
    seen: dict[str, list[str]] = {}
    for path in tests.rglob("test_*.py"):
        seen.setdefault(path.name, []).append(str(path.relative_to(tests)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
