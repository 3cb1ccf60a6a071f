"""The package's shape, checked from its source text: `bash scripts/check.sh` runs this file alone.

- Only the compatibility module imports `jax._src` (JAX's private modules, which change between
  versions): one place to read and to fix when a jax version comes out.
- No import cycle among donate's modules, so the layers (user API, stages, planning, jaxpr walking,
  compatibility) can be read from the bottom up.
- No module, class or function over its size limit, except the known offenders listed below.
- Every committed notebook (.ipynb and docs/notebooks/ page) matches its source notebooks/*.py.

Imports are read with `ast` from every donate/**/*.py: `import donate._x`, `from donate import _x`,
`from donate._x import y` and relative imports, at any depth, function-level imports included (a
function-level import still makes the importing module depend on the imported one; it only moves
the cycle from import time to call time).
"""

import ast
import dataclasses
import functools
import importlib.util
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = REPO / "donate"
# The one module that may import jax._src (CONTRIBUTING.md: how to add a JAX version).
ALLOWED = {"_compat.py"}
# The user API: no other donate module may import these (layers point down, see CONTRIBUTING.md).
USER_API = {"donate", "donate.transforms", "donate.symm", "donate.planner", "donate.targets",
            "donate.__main__"}
# Code written as a user would write it (the demo's and the tests' workloads): above the API.
CLIENTS = {"donate._examples", "donate._demo"}
MODULE_LINES, CLASS_LINES, FUNCTION_LINES = 500, 200, 80


@dataclasses.dataclass(frozen=True, slots=True)
class Import:
  """One import statement of a donate module: what it names and where."""

  module: str  # the importing module, e.g. "donate._jit"
  target: str  # the module it imports (a donate module or not), e.g. "donate._into", "jax._src.core"
  line: int


def _module_name(path: pathlib.Path) -> str:
  parts = path.relative_to(REPO).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


@functools.cache
def _imports(module: str) -> tuple[Import, ...]:
  """Every import in `module`, at any depth; `from P import a` names P.a when that is a module."""
  path = MODULES[module]
  package = module if path.name == "__init__.py" else module.rpartition(".")[0]
  found = []
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      found += [Import(module, alias.name, node.lineno) for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(anchor + ([node.module] if node.module else []))
      for alias in node.names:
        sub = f"{base}.{alias.name}"
        found.append(Import(module, sub if sub in MODULES or sub == "jax._src" else base, node.lineno))
  return tuple(found)


def import_graph() -> dict[str, set[str]]:
  """donate module -> the donate modules it imports."""
  return {m: {i.target for i in _imports(m) if i.target in MODULES and i.target != m}
          for m in MODULES}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan), each sorted."""
  index, low, stack, found = {}, {}, [], []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = stack[stack.index(v):]
      del stack[stack.index(v):]
      if len(component) > 1:
        found.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return sorted(found)


def oversized() -> dict[str, int]:
  """"path" or "path::Qualified.name" -> lines, for each module, class and function over its limit."""
  found = {}
  for path in MODULES.values():
    rel = path.relative_to(REPO).as_posix()
    text = path.read_text()
    if len(text.splitlines()) > MODULE_LINES:
      found[rel] = len(text.splitlines())

    def walk(node, prefix):
      for child in ast.iter_child_nodes(node):
        limit = {ast.ClassDef: CLASS_LINES, ast.FunctionDef: FUNCTION_LINES,
                 ast.AsyncFunctionDef: FUNCTION_LINES}.get(type(child))
        name = f"{prefix}{child.name}" if limit else prefix
        if limit and child.end_lineno - child.lineno + 1 > limit:
          found[f"{rel}::{name}"] = child.end_lineno - child.lineno + 1
        walk(child, f"{name}." if limit else prefix)

    walk(ast.parse(text), "")
  return found


def test_the_checks_see_the_package():
  assert {"donate", "donate.transforms", "donate.symm", "donate.planner"} <= set(MODULES)
  graph = import_graph()
  assert "donate.transforms" in graph["donate"]  # `from donate.transforms import jit as jit`
  assert sum(map(len, graph.values())) > 2 * len(graph)


def test_cycles_finds_a_cycle():
  assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
  assert cycles({"a": {"b"}, "b": set()}) == []


def test_only_the_compat_module_imports_jax_private_modules():
  offending = [f"{MODULES[i.module].relative_to(REPO)}:{i.line} imports {i.target}"
               for m in MODULES for i in _imports(m)
               if (i.target == "jax._src" or i.target.startswith("jax._src."))
               and MODULES[m].name not in ALLOWED]
  assert not offending, "only " + " or ".join(sorted(ALLOWED)) + " may import jax._src:\n" + \
      "\n".join(offending)


def test_no_import_cycle():
  found = cycles(import_graph())
  edges = [f"  {MODULES[i.module].relative_to(REPO)}:{i.line} imports {i.target}"
           for component in found for m in component for i in _imports(m) if i.target in component]
  assert not found, "import cycles among donate's modules: " + "; ".join(
      ", ".join(c) for c in found) + "\n" + "\n".join(edges)


def test_internal_modules_never_import_the_user_api():
  upward = [f"{MODULES[m].relative_to(REPO)}:{i.line} imports {i.target}"
            for m in MODULES if m not in USER_API | CLIENTS for i in _imports(m) if i.target in USER_API]
  assert not upward, "imports that point up from the internals to the user API:\n" + "\n".join(upward)


def test_nothing_is_oversized():
  found = oversized()
  assert not found, (f"over the limits (module {MODULE_LINES}, class {CLASS_LINES}, function "
                     f"{FUNCTION_LINES} lines): " + ", ".join(f"{k} ({v})" for k, v in sorted(found.items())))


def _notebook_tool():
  spec = importlib.util.spec_from_file_location("notebook_tool", REPO / "scripts" / "notebooks.py")
  tool = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(tool)
  return tool


def test_committed_notebooks_match_their_sources():
  pytest.importorskip("jupytext")
  tool = _notebook_tool()
  assert tool.sources(), "no notebooks/*.py"
  found = tool.orphans() + [p for source in tool.sources() for p in tool.problems(source)]
  assert not found, "\n".join(found)
