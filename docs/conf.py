"""Sphinx configuration of the documentation site: `bash scripts/docs.sh` builds it into docs/_build/html.

Pages are MyST markdown; the API reference is generated from the docstrings (autodoc, autosummary,
napoleon for the Google-style sections); the notebooks are the executed notebooks/*.ipynb, rendered
by myst-nb without running them again. Nothing here needs the network: there is no intersphinx, so
references to JAX's and numpy's own objects stay plain text (`nitpick_ignore_regex`), while every
reference to a name of this package must resolve (`nitpicky`, and the build runs with `-W`).
"""

import importlib
import inspect
import pathlib
import re
import shutil
import sys

DOCS = pathlib.Path(__file__).resolve().parent
REPO = DOCS.parent
sys.path.insert(0, str(REPO))

import donate  # noqa: E402  (after the path: the checkout's package, installed or not)

project = "donate"
author = "the donate authors"
copyright = "the donate authors"
release = version = donate.__version__

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
]

# The notebooks are rendered from their executed .ipynb (written by scripts/notebooks.sh from the
# jupytext sources notebooks/*.py); they are copied under _generated/ because Sphinx only reads
# sources inside docs/. The build never runs a JAX program.
NOTEBOOKS = DOCS / "_generated" / "notebooks"
shutil.rmtree(NOTEBOOKS, ignore_errors=True)
NOTEBOOKS.mkdir(parents=True)
for _notebook in sorted((REPO / "notebooks").glob("[0-9]*.ipynb")):
  shutil.copy2(_notebook, NOTEBOOKS / _notebook.name)
nb_execution_mode = "off"
nb_merge_streams = True

# docs/notebooks/ holds the notebooks' standalone HTML pages (scripts/notebooks.sh), not sources.
exclude_patterns = ["_build", "notebooks", "Thumbs.db", ".DS_Store"]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# The API reference lists every name of each public module's __all__: the listings and one stub
# page per name are written here, so a new public name gets its page without editing api.md (which
# says where each listing goes: "{api-listing} donate.symm").
API_MODULES = {
    "donate": "The user API, `import donate` (`donate.__all__`).",
    "donate.symm": "Symmetric memory for collectives (`donate.symm.__all__`); see "
                   ":doc:`symmetric`.",
    "donate.planner": "Liveness and buffer planning (`donate.planner.__all__`); see :doc:`planner`.",
    "donate.targets": "Abstract H100/B200 meshes for ahead-of-time GPU compiles "
                      "(`donate.targets.__all__`).",
    "donate.transforms": "The function `donate.jit` returns and its staged objects "
                         "(`donate.transforms.__all__`; `jit`, `donate_buffer` and `alias` are "
                         "under `donate`).",
}
STUBS = DOCS / "_autosummary"


def _stub(full: str, obj) -> str:
  """The page of one public name: its docstring, and a class's members."""
  module, _, name = full.rpartition(".")
  title = f"{full}\n{'=' * len(full)}\n\n"
  if inspect.ismodule(obj):
    return (title + f".. automodule:: {full}\n   :no-members:\n\n"
            "Its public names are listed in the :doc:`API reference </api>`.\n")
  if isinstance(obj, type):
    kind = "autoexception" if issubclass(obj, BaseException) else "autoclass"
    return title + f".. currentmodule:: {module}\n\n.. {kind}:: {name}\n   :members:\n"
  return title + f".. currentmodule:: {module}\n\n.. autofunction:: {name}\n"


def _api_listing(module_name: str) -> str:
  """An autosummary of `module_name`'s public names; writes their stub pages.

  A class that is also `donate.X` is documented once, as `donate.X` (two pages would describe one
  object twice); a function re-exported by a submodule gets a page under each name.
  """
  module = importlib.import_module(module_name)
  entries, same = [] if module_name == "donate" else [module_name], []
  for name in module.__all__:
    obj = getattr(module, name)
    if module_name != "donate" and getattr(donate, name, None) is obj:
      if isinstance(obj, type):
        same.append(f"``{module_name}.{name}`` is :py:class:`donate.{name}`.")
        continue
      if module_name == "donate.transforms":
        continue
    entries.append(f"{module_name}.{name}")
  for full in entries:
    obj = module if full == module_name else getattr(module, full.rpartition(".")[2])
    (STUBS / f"{full}.rst").write_text(_stub(full, obj))
  lines = [API_MODULES[module_name], "", "```{eval-rst}", ".. autosummary::",
           "   :toctree: _autosummary", ""]
  lines += [f"   {entry}" for entry in entries] + ["", *same, "```"]
  return "\n".join(lines) + "\n"


shutil.rmtree(STUBS, ignore_errors=True)
STUBS.mkdir()
API_LISTINGS = {name: _api_listing(name) for name in API_MODULES}
autosummary_generate = False


def _insert_api_listings(app, docname, source):
  if docname == "api":
    source[0] = re.sub(r"^\{api-listing\} (\S+)$", lambda m: API_LISTINGS[m.group(1)], source[0],
                       flags=re.M)
autodoc_default_options = {"members": True, "show-inheritance": False}
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# Docstrings write code as `name` (markdown habit) and ``name``: both render as code.
default_role = "code"

nitpicky = True
# Objects of other projects (no intersphinx: the build stays offline) and typing's own names.
nitpick_ignore_regex = [
    # Private types that appear in public signatures and attributes (a public name documents each
    # object a user handles; donate._x.Name of a public object resolves through its canonical name).
    ("py:.*", r"donate\.(\w+\.)*_\w+\..*"),
    ("py:.*", r"(jax|jaxlib|numpy|np|jnp|matplotlib|collections|typing|types|dataclasses|enum)(\..*)?"),
    ("py:.*", r"(Any|Callable|Sequence|Mapping|Iterable|Iterator|Hashable|NamedTuple|Optional)"),
    ("py:.*", r"(Array|ArrayLike|PyTree|Mesh|Sharding|NamedSharding|PartitionSpec|ShapeDtypeStruct)"),
    ("py:class", r"(object|int|float|str|bool|bytes|tuple|list|dict|set|frozenset|type|None)"),
]

html_theme = "sphinx_book_theme"
html_title = "donate"
html_theme_options = {
    "show_toc_level": 2,
    "navigation_with_keys": False,
}
html_static_path = ["_static"]
html_css_files = ["donate.css"]  # the content column at 1280 px (see the file)


_GLUED = re.compile(r"(?<![`\w])(`{1,2})([^`\n]+?)\1(?=\w)")


def _docstring_fixes(app, what, name, obj, options, lines):
  """Docstrings are written for `help()` and doctests: code followed by letters
  (`` `jax.ShapeDtypeStruct`s ``) needs an escaped space to end the code in reStructuredText."""
  for i, line in enumerate(lines):
    lines[i] = _GLUED.sub(lambda m: m.group(0) + "\\ ", _STARRED.sub(_escape_stars, line))


# "*args, **kwargs: ..." in an Args section: napoleon escapes the first name's stars only.
_STARRED = re.compile(r"^(\s+\*\w+)((?:, \*{1,2}\w+)+)(:)")


def _escape_stars(match: re.Match) -> str:
  return match.group(1) + match.group(2).replace("*", "\\*") + match.group(3)


def _property_sentence(app, what, name, obj, options, lines):
  """A property's first line "Noun: explanation" is a sentence, not napoleon's "type: description":
  put it back as written (napoleon runs between the two halves, at its priority 500)."""
  if what != "property" or not lines or ":" not in lines[0]:
    return
  first = lines[0]
  yield_back = _PROPERTY_FIRST_LINES.setdefault(name, first)
  del yield_back


_PROPERTY_FIRST_LINES: dict[str, str] = {}


def _property_restore(app, what, name, obj, options, lines):
  first = _PROPERTY_FIRST_LINES.pop(name, None)
  if first is None:
    return
  while lines and (not lines[-1].strip() or lines[-1].startswith(":type:")):
    lines.pop()
  rest = lines[1:]
  lines[:] = [first, *rest]


def setup(app):
  app.connect("source-read", _insert_api_listings)
  app.connect("autodoc-process-docstring", _docstring_fixes, priority=400)
  app.connect("autodoc-process-docstring", _property_sentence, priority=410)
  app.connect("autodoc-process-docstring", _property_restore, priority=600)
