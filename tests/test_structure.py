"""The package's shape, checked from its source text: `bash scripts/check.sh` runs this file alone.

- Only the compatibility module imports `jax._src` (JAX's private modules, which change between
  versions): one place to read and to fix when a jax version comes out.
- No import cycle among donate's modules, so the layers (user API, stages, planning, jaxpr walking,
  compatibility) can be read from the bottom up.
- No module, class or function over its size limit, except the known offenders listed below.
- Every committed notebook (.ipynb and docs/notebooks/ page) matches its source notebooks/*.py.
- No code matches on the words of a decision or a message (`reason`, `source`, `str(e)`): it reads
  the typed fields (`action`, `cause`, `request`) and exception types.

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


# ---- code reads typed fields, never words --------------------------------------------------------
# The words of a decision (`reason`, `source`, a plan's `notes`) and of an exception (`str(e)`,
# `e.args`, `e.message`) are for people: code reads `action`, `cause`, `request` and exception
# types. A match on them is a comparison (==, !=, in, not in) with a string or an UPPER_CASE
# constant, or a string method (startswith, removeprefix, find, split, ...) called on them.
WORDED = {"reason", "source", "notes", "message", "args"}
MATCHING = {"startswith", "endswith", "removeprefix", "removesuffix", "find", "rfind", "index",
            "count", "split", "rsplit", "partition", "rpartition"}
EXCEPTION_NAMES = {"e", "err", "error", "exc", "exception"}
# path -> (the matching line's text, why it is not a match on words)
WORD_MATCH_ALLOWED = {
    "donate/_planner/memory_plan.py": (
        'copies_from[b.name].reason == "out"',
        "the planner's `Copy.reason` is a direction tag, \"in\" or \"out\", not words"),
}


def _is_text(node) -> bool:
  """A string, a collection of strings, or a name spelled as a constant (`NOT_A_DEVICE_BUFFER`)."""
  if isinstance(node, ast.Constant):
    return isinstance(node.value, str)
  if isinstance(node, ast.JoinedStr):
    return True
  if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
    return any(_is_text(e) for e in node.elts)
  name = (node.id if isinstance(node, ast.Name) else
          node.attr if isinstance(node, ast.Attribute) else "").lstrip("_")
  return len(name) > 1 and name.isupper()


def _is_words(node, exceptions: set[str]) -> bool:
  """`x.reason`, `x.source`, ... (an object's own fields, `self.x`, excepted) or `str(e)` of an
  exception."""
  if isinstance(node, ast.Attribute) and node.attr in WORDED:
    return not (isinstance(node.value, ast.Name) and node.value.id == "self")
  if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in (
      "str", "repr", "format"):
    return (len(node.args) == 1 and isinstance(node.args[0], ast.Name)
            and node.args[0].id in exceptions)
  return False


def word_matches(text: str) -> list[int]:
  """The lines of `text` (Python source) that match on the words of a decision or a message."""
  tree = ast.parse(text)
  exceptions = EXCEPTION_NAMES | {h.name for h in ast.walk(tree)
                                  if isinstance(h, ast.ExceptHandler) and h.name}
  found = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Compare) and any(
        isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) for op in node.ops):
      sides = [node.left, *node.comparators]
      if any(_is_words(s, exceptions) for s in sides) and any(_is_text(s) for s in sides):
        found.append(node.lineno)
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and node.func.attr in MATCHING and _is_words(node.func.value, exceptions)):
      found.append(node.lineno)
  return sorted(found)


def test_word_matches_finds_matches_on_words():
  planted = '''
explicit = [d for d in plan.unusable if d.source.startswith("alias at ")]
host = any(d.reason.startswith(_donation_plan.NOT_A_DEVICE_BUFFER) for d in plan.decisions)
off = [d.path for d in plan.decisions if d.reason == JAX_DISABLED]
got = d.reason.removeprefix(NOT_A_DEVICE_BUFFER)
try:
  pass
except ValueError as failure:
  if "donate" in str(failure):
    raise
plain = d.reason if d.source in ("-", "") else d.source
'''
  assert word_matches(planted) == [2, 3, 4, 5, 9, 11]
  typed = '''
explicit = [d for d in plan.unusable if d.request == Request.ALIAS]
host = any(d.cause == Cause.NOT_A_DEVICE_BUFFER for d in plan.decisions)
text = f"{d.reason} [{d.source}]" if d.requested else d.reason
fn = "copy_out" if self.reason == "out" else "copy_in"
token = "token" in str(result_type)
'''
  assert word_matches(typed) == []


def test_no_code_matches_on_the_words_of_a_reason_or_a_message():
  found, allowed_seen = [], set()
  for path in sorted(PACKAGE.glob("*.py")) + sorted(PACKAGE.glob("*/*.py")):
    rel = path.relative_to(REPO).as_posix()
    lines = path.read_text().splitlines()
    for line in word_matches(path.read_text()):
      allowed = WORD_MATCH_ALLOWED.get(rel)
      if allowed is not None and allowed[0] in lines[line - 1]:
        allowed_seen.add(rel)
      else:
        found.append(f"{rel}:{line}: {lines[line - 1].strip()}")
  assert not found, ("code that matches on the words of a decision or a message (read `action`, "
                     "`cause`, `request` or the exception's type instead):\n" + "\n".join(found))
  assert allowed_seen == set(WORD_MATCH_ALLOWED), "stale WORD_MATCH_ALLOWED entries"
