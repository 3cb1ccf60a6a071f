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
import shutil

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = REPO / "donate"
# The modules that may import jax._src (CONTRIBUTING.md: how to add a JAX version).
ALLOWED = {"donate/_base/compat.py", "donate/_base/compat_aliases.py", "donate/_base/compat_remat.py"}
# The user API: no other donate module may import these (layers point down, see CONTRIBUTING.md).
USER_API = {"donate", "donate.transforms", "donate.symm", "donate.planner", "donate.targets",
            "donate.profile", "donate.__main__"}
# Code written as a user would write it (the demo's and the tests' workloads): above the API.
CLIENTS = {"donate._examples", "donate._demo", "donate.__main__"}
# The layers, top first (CONTRIBUTING.md's picture): a module imports its own layer or lower ones.
# A name ending in "." is a package (its modules, at any depth); others are modules. In a layer
# marked `apart`, each package is on its own: the analysis packages never import each other.
LAYERS: tuple[tuple[str, frozenset[str], bool], ...] = (
    ("clients", frozenset(CLIENTS), False),
    ("user API", frozenset(USER_API - CLIENTS), False),
    ("donate.jit", frozenset({"donate._jit."}), False),
    ("analysis", frozenset({"donate._plan.", "donate._profile.", "donate._symm.",
                            "donate._planner."}), True),
    ("XLA's output", frozenset({"donate._xla."}), False),
    ("foundation", frozenset({"donate._base."}), False),
)
MODULE_LINES, CLASS_LINES, FUNCTION_LINES = 500, 200, 80


@dataclasses.dataclass(frozen=True, slots=True)
class Import:
  """One import statement of a donate module: what it names and where."""

  module: str  # the importing module, e.g. "donate._jit.wrapper"
  target: str  # the module it imports (a donate module or not), e.g. "donate._jit.into", "jax._src.core"
  line: int


def _module_name(path: pathlib.Path, root: pathlib.Path = REPO) -> str:
  parts = path.relative_to(root).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules_of(root: pathlib.Path) -> dict[str, pathlib.Path]:
  """Module name -> file, for every donate/**/*.py under `root` (a checkout or a copy of one)."""
  return {_module_name(p, root): p for p in sorted((root / "donate").rglob("*.py"))}


MODULES = modules_of(REPO)


def _imports(module: str, modules: dict[str, pathlib.Path] = MODULES) -> tuple[Import, ...]:
  """Every import in `module`, at any depth; `from P import a` names P.a when that is a module."""
  if modules is MODULES:
    return _imports_here(module)
  return _read_imports(module, modules)


@functools.cache
def _imports_here(module: str) -> tuple[Import, ...]:
  return _read_imports(module, MODULES)


def _read_imports(module: str, modules: dict[str, pathlib.Path]) -> tuple[Import, ...]:
  path = modules[module]
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
        found.append(Import(module, sub if sub in modules or sub == "jax._src" else base, node.lineno))
  return tuple(found)


def layer_of(module: str) -> tuple[int, str]:
  """(rank, group) of a donate module: rank 0 is the top layer; group is its package or module."""
  for rank, (_, names, _) in enumerate(LAYERS):
    for name in names:
      if module == name or (name.endswith(".") and (module + ".").startswith(name)):
        return rank, name
  raise LookupError(f"{module} is in no layer: add it to LAYERS (and CONTRIBUTING.md's picture)")


def upward_imports(modules: dict[str, pathlib.Path], root: pathlib.Path = REPO) -> list[str]:
  """Each import that points up the layers, or across the packages of an `apart` layer."""
  found = []
  for module, path in modules.items():
    rank, group = layer_of(module)
    for i in _imports(module, modules):
      if i.target not in modules or i.target == module:
        continue
      target_rank, target_group = layer_of(i.target)
      across = target_rank == rank and LAYERS[rank][2] and target_group != group
      if target_rank < rank or across:
        where = "beside it, in another package" if across else f"above it ({LAYERS[target_rank][0]})"
        found.append(f"{path.relative_to(root).as_posix()}:{i.line} ({LAYERS[rank][0]}) imports "
                     f"{i.target}, {where}")
  return found


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
               and MODULES[m].relative_to(REPO).as_posix() not in ALLOWED]
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


def test_imports_only_go_down_the_layers():
  assert [layer_of(m) for m in ("donate", "donate._jit", "donate._plan.pairing", "donate._base.text")] \
      == [(1, "donate"), (2, "donate._jit."), (3, "donate._plan."), (5, "donate._base.")]
  found = upward_imports(MODULES)
  assert not found, "imports that point up the layers (CONTRIBUTING.md's picture):\n" + "\n".join(found)


def test_an_upward_import_planted_in_a_copy_is_found(tmp_path):
  shutil.copytree(PACKAGE, tmp_path / "donate", ignore=shutil.ignore_patterns("__pycache__"))
  assert upward_imports(modules_of(tmp_path), tmp_path) == []
  text = tmp_path / "donate" / "_base" / "text.py"
  text.write_text(text.read_text() + "\n\ndef _late():\n  from donate._jit import signature\n")
  pairing = tmp_path / "donate" / "_plan" / "pairing.py"
  pairing.write_text("from donate._profile import naming\n" + pairing.read_text())
  found = upward_imports(modules_of(tmp_path), tmp_path)
  assert len(found) == 2, found
  assert found[0].startswith("donate/_base/text.py:") and "imports donate._jit.signature, above it" \
      in found[0]
  assert found[1].startswith("donate/_plan/pairing.py:1 (analysis) imports donate._profile.naming, "
                             "beside it")


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
