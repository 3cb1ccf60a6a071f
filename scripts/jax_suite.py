"""Writes JAX's own jit tests, with every `jax.jit` turned into `donate.jit`, into a folder.

Maintainer tool behind `scripts/jax_suite.sh` (never run in CI). Reads JAX's test files that exercise
`jax.jit` (`TEST_FILES`: api, pjit, export, mutable_array, layout, shard_map, memories, array,
debugging_primitives, and those of the executable's serialization and caches and of effects: aot,
compilation_cache, cache_key, multi_device, jaxpr_effects, x64_context, checkify; and three more
groups, from debug_info to scipy_optimize) of a jax-ml/jax git checkout at a tag and writes them
to OUT_DIR, with a `pytest.ini` carrying the checkout's own pytest settings (warnings are errors,
as in JAX's CI).

The rewrite works on the syntax tree and replaces, in place, each reference to JAX's jit:
`jax.jit` (decorator, call, `partial(jax.jit, ...)`), `api.jit` where `api` is `jax._src.api`,
`jit` imported from jax, and `pjit` imported from `jax._src.pjit` (the deprecated spelling of
`jax.jit`; unlike it, `pjit` takes the mesh from `with mesh:`, so tests that rely on that fail with
`--target jax.jit` too). A name that a function, lambda or comprehension rebinds (a parameter called `jit`) is
left alone there. `import donate` is put on the line of the first import, so line numbers match
the upstream file. `pmap`, `vmap` and every other API are untouched.

Usage:
  python scripts/jax_suite.py write CHECKOUT TAG OUT_DIR [--target donate.jit|jax.jit|none|patch]
      [--files tests/lax_test.py ...]
    (`jax.jit` rewrites to JAX's own jit, a check of the rewriter; `none` copies the files; `patch`
    copies them and sets `jax.jit = donate.jit` in a conftest.py, for files that compile through
    JAX's test utilities)
  python scripts/jax_suite.py compare PLAIN.xml SELF_CHECK.xml DONATE.xml
    (pytest --junitxml files of the three runs: lists what passes plain and fails with donate.jit)
"""

import argparse
import ast
import collections
import dataclasses
import subprocess
import sys
import tomllib
from pathlib import Path
from xml.etree import ElementTree

# The files that exercise `jax.jit` (issue 21 names the first nine); `write` copies all, the shell
# script runs api_test.py and pjit_test.py unless test files are named.
TEST_FILES = tuple(f"tests/{name}_test.py" for name in (
    "api", "pjit", "export", "mutable_array", "layout", "shard_map", "memories", "array",
    "debugging_primitives", "aot", "compilation_cache", "cache_key", "multi_device",
    "jaxpr_effects", "x64_context", "checkify",
    # A second group: jit's debug info and names, callbacks, control flow, key arrays and their
    # reuse checks, error checks, metadata, FFI calls, dtypes, hijax types. (state_test.py needs
    # a test utility JAX's wheel does not ship.)
    "debug_info", "python_callback", "lax_control_flow", "key_reuse", "error_check",
    "xla_metadata", "ffi", "name_stack", "core", "random", "dtypes", "hijax",
    "ragged_collective", "sparse",
    # A third: custom derivatives, NaN checks (which turn donation off), JAX's errors and their
    # filtered tracebacks, compile logging, custom partitioning, symbolic shapes, random bits.
    "custom_api", "debug_nans", "errors", "logging", "custom_partitioning", "shape_poly",
    "random_lax", "scheduling_groups", "async_collectives",
    # A fourth: shard_alike, metadata and source info, the debugger, several backends, control
    # dependencies, checked numpy errors, tree utilities, custom solvers, pmap, batching, indexing.
    "shard_alike", "metadata", "debugger", "multibackend", "control_deps", "source_info",
    "jax_numpy_error", "xla_transform", "tree_util", "linalg_sharding", "jax_jit",
    "custom_root", "custom_linear_solve", "jaxpr_util", "fused",
    "export_serialization_back_compat", "nn", "sparsify", "pmap", "batching",
    "lax_numpy_indexing", "scipy_optimize"))
# (module, name) pairs whose import binds JAX's jit under the imported name.
JIT_IMPORTS = {("jax", "jit"), ("jax._src.api", "jit"), ("jax._src.pjit", "pjit"),
               ("jax.experimental.pjit", "pjit")}
# Modules whose `.jit` attribute is JAX's jit.
JIT_MODULES = {"jax", "jax._src.api"}
_COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


@dataclasses.dataclass(frozen=True, slots=True)
class Edit:
  """Replace bytes [start, end) of line `line` (1-based) by `text`; `kind` names what it was."""
  line: int
  start: int
  end: int
  text: str
  kind: str


def git_show(checkout: str, tag: str, path: str) -> str:
  """The text of `path` at `tag` in the git checkout (a clone or a bare git dir)."""
  return subprocess.run(["git", "-C", checkout, "show", f"{tag}:{path}"], check=True,
                        capture_output=True, text=True).stdout


def jit_bindings(tree: ast.Module) -> tuple[set[str], set[str]]:
  """Names bound to JAX's jit, and names bound to a module whose `.jit` is JAX's jit."""
  names, modules = set(), set()
  for node in tree.body:
    if isinstance(node, ast.ImportFrom) and node.level == 0:
      for a in node.names:
        if (node.module, a.name) in JIT_IMPORTS:
          names.add(a.asname or a.name)
        if f"{node.module}.{a.name}" in JIT_MODULES:
          modules.add(a.asname or a.name)
    elif isinstance(node, ast.Import):
      modules.update(a.asname or a.name for a in node.names
                     if a.name in JIT_MODULES and (a.asname or "." not in a.name))
  return names, modules


def _bound_in_scope(node: ast.AST) -> set[str]:
  """Names a function, lambda or comprehension binds (over-approximated: nested scopes count)."""
  if isinstance(node, _COMPREHENSIONS):
    return {n.id for g in node.generators for n in ast.walk(g.target) if isinstance(n, ast.Name)}
  args = node.args
  bound = {a.arg for a in args.posonlyargs + args.args + args.kwonlyargs}
  bound.update(a.arg for a in (args.vararg, args.kwarg) if a is not None)
  body = node.body if isinstance(node.body, list) else [node.body]
  for stmt in body:
    bound.update(n.id for n in ast.walk(stmt)
                 if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)))
  return bound


class _Finder(ast.NodeVisitor):
  """Collects an Edit for every reference to JAX's jit that is not shadowed where it appears."""

  def __init__(self, names, modules, target):
    self.names, self.modules, self.target = names, modules, target
    self.shadowed = [frozenset()]
    self.edits, self.skipped = [], []

  def _edit(self, node, kind):
    if node.lineno != node.end_lineno:   # `(jax\n .jit)`: not written in JAX's tests
      raise ValueError(f"line {node.lineno}: a jit reference spans lines")
    self.edits.append(Edit(node.lineno, node.col_offset, node.end_col_offset, self.target, kind))

  def _visit_scope(self, node, outside, inside):
    """Visits `outside` in the enclosing scope and `inside` with the names `node` binds shadowed."""
    self._visit_all(outside)
    self.shadowed.append(self.shadowed[-1] | _bound_in_scope(node))
    self._visit_all(inside)
    self.shadowed.pop()

  def _visit_all(self, nodes):
    for n in nodes:
      if n is not None:
        self.visit(n)

  def visit_FunctionDef(self, node):
    a = node.args
    self._visit_scope(node, node.decorator_list + a.defaults + a.kw_defaults + [node.returns],
                      node.body)

  visit_AsyncFunctionDef = visit_FunctionDef

  def visit_Lambda(self, node):
    self._visit_scope(node, node.args.defaults + node.args.kw_defaults, [node.body])

  def _visit_comprehension(self, node):
    first, *rest = node.generators   # the first iterable is evaluated in the enclosing scope
    inside = [getattr(node, f) for f in ("elt", "key", "value") if hasattr(node, f)]
    inside += [first.target, *first.ifs]
    for g in rest:
      inside += [g.target, g.iter, *g.ifs]
    self._visit_scope(node, [first.iter], inside)

  visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _visit_comprehension

  def visit_Attribute(self, node):
    value = node.value
    if (node.attr == "jit" and isinstance(value, ast.Name) and value.id in self.modules
        and isinstance(node.ctx, ast.Load)):
      if value.id in self.shadowed[-1]:
        self.skipped.append(node.lineno)
      else:
        self._edit(node, f"{value.id}.jit")
      return
    self.generic_visit(node)

  def visit_Name(self, node):
    if node.id in self.names and isinstance(node.ctx, ast.Load):
      if node.id in self.shadowed[-1]:
        self.skipped.append(node.lineno)
      else:
        self._edit(node, node.id)


def _first_import_line(tree: ast.Module) -> int:
  for node in tree.body:
    if isinstance(node, (ast.Import, ast.ImportFrom)) and getattr(node, "module", "") != "__future__":
      return node.lineno
  raise ValueError("no import statement to put `import donate` before")


def apply_edits(source: str, edits: list[Edit], prefix_line: int, prefix: str) -> str:
  """Applies the edits (byte columns, as `ast` gives them) and prefixes one line."""
  lines = source.splitlines(keepends=True)
  for e in sorted(edits, key=lambda e: (e.line, e.start), reverse=True):
    raw = lines[e.line - 1].encode()
    lines[e.line - 1] = (raw[:e.start] + e.text.encode() + raw[e.end:]).decode()
  lines[prefix_line - 1] = prefix + lines[prefix_line - 1]
  return "".join(lines)


def rewrite(source: str, target: str = "donate.jit") -> tuple[str, collections.Counter, list]:
  """The source with every reference to JAX's jit replaced by `target`.

  Returns the new source, the count of replacements by what they replaced, and the line numbers
  of references left alone because a local name shadows them.
  """
  tree = ast.parse(source)
  names, modules = jit_bindings(tree)
  if target.startswith("donate.") and any(
      isinstance(n, ast.Name) and n.id == "donate" for n in ast.walk(tree)):
    raise ValueError("the file already uses the name `donate`")
  finder = _Finder(names, modules, target)
  finder.visit(tree)
  prefix = "import donate; " if target.startswith("donate.") else ""
  new = apply_edits(source, finder.edits, _first_import_line(tree), prefix)
  ast.parse(new)
  return new, collections.Counter(e.kind for e in finder.edits), finder.skipped


def pytest_ini(pyproject_text: str) -> str:
  """A pytest.ini with the checkout's filterwarnings and markers (warnings are errors)."""
  options = tomllib.loads(pyproject_text).get("tool", {}).get("pytest", {}).get("ini_options", {})
  out = ["[pytest]"]
  for key in ("filterwarnings", "markers"):
    if options.get(key):
      out.append(f"{key} =")
      out.extend(f"    {v}" for v in options[key])
  return "\n".join(out) + "\n"


# The `patch` target: the files unmodified, and `jax.jit = donate.jit` set before any of them is
# imported, as a user patches JAX for a framework they did not write. JAX's test utilities compile
# through `jax._src.api.jit` (`_CompileAndCheck`, which lax_test and lax_numpy_test use); they are
# given donate.jit too, while JAX's own modules keep their jit.
PATCH_CONFTEST = """\
import types

import jax
from jax._src import api, test_util

import donate

jax.jit = donate.jit


class _Api(types.ModuleType):
  def __getattr__(self, name):
    return getattr(api, name)


test_util.api = _Api(api.__name__)
test_util.api.jit = donate.jit
"""


def write(checkout: str, tag: str, out_dir: Path, target: str, files=TEST_FILES) -> None:
  """Writes the rewritten test files and the pytest.ini into `out_dir`."""
  out_dir.mkdir(parents=True, exist_ok=True)
  (out_dir / "pytest.ini").write_text(pytest_ini(git_show(checkout, tag, "pyproject.toml")))
  if target == "patch":
    (out_dir / "conftest.py").write_text(PATCH_CONFTEST)
  for path in files:
    source = git_show(checkout, tag, path)
    name = Path(path).name
    if target not in ("none", "patch"):
      source, counts, skipped = rewrite(source, target)
      detail = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
      print(f"{name}: {sum(counts.values())} rewritten to {target} ({detail}); "
            f"left alone (a local name shadows it): lines {skipped or 'none'}", file=sys.stderr)
    (out_dir / name).write_text(source)


def outcomes(junit_xml: Path) -> dict[str, tuple[str, str]]:
  """Test id -> (outcome, first line of the failure message) from a pytest --junitxml file."""
  result = {}
  for case in ElementTree.parse(junit_xml).iter("testcase"):
    module, _, cls = case.get("classname").rpartition(".")
    bad = next(iter(case.findall("failure") + case.findall("error")), None)
    outcome = "fail" if bad is not None else "skip" if case.find("skipped") is not None else "pass"
    message = (bad.get("message") or "").strip().split("\n")[0] if bad is not None else ""
    result[f"{module.replace('.', '/')}.py::{cls}::{case.get('name')}"] = (outcome, message)
  return result


def compare(plain: Path, self_check: Path, donated: Path) -> str:
  """Lists the tests that pass unmodified and fail with donate.jit, with the first error line.

  A test that also fails rewritten to jax.jit is listed apart: the rewrite, not donate.jit,
  breaks it (the deprecated `pjit` reads the mesh from `with mesh:`, `jax.jit` does not).
  """
  base, same, ours = outcomes(plain), outcomes(self_check), outcomes(donated)
  regressed = sorted(t for t, (o, _) in ours.items() if o == "fail" and base.get(t, ("",))[0] == "pass")
  by_rewrite = [t for t in regressed if same.get(t, ("",))[0] == "fail"]
  by_donate = [t for t in regressed if t not in by_rewrite]
  lines = [f"{len(by_donate)} pass with jax.jit and fail with donate.jit "
           f"(of {sum(o == 'pass' for o, _ in base.values())} that pass unmodified):"]
  lines += [f"  {t}  --  {ours[t][1][:160]}" for t in by_donate]
  lines.append(f"{len(by_rewrite)} more fail also when rewritten to jax.jit (not donate.jit's):")
  lines += [f"  {t}  --  {same[t][1][:160]}" for t in by_rewrite]
  return "\n".join(lines)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  sub = parser.add_subparsers(dest="command", required=True)
  w = sub.add_parser("write", help="write the rewritten test files into OUT_DIR")
  w.add_argument("checkout")
  w.add_argument("tag")
  w.add_argument("out_dir", type=Path)
  w.add_argument("--target", default="donate.jit",
                 choices=("donate.jit", "jax.jit", "none", "patch"))
  w.add_argument("--files", nargs="*", help="test files (tests/NAME_test.py) other than TEST_FILES")
  c = sub.add_parser("compare", help="list what passes unmodified and fails with donate.jit")
  for name in ("plain_xml", "self_check_xml", "donate_xml"):
    c.add_argument(name, type=Path)
  args = parser.parse_args(argv)
  if args.command == "write":
    write(args.checkout, args.tag, args.out_dir, args.target, args.files or TEST_FILES)
  else:
    print(compare(args.plain_xml, args.self_check_xml, args.donate_xml))
  return 0


if __name__ == "__main__":
  sys.exit(main())
