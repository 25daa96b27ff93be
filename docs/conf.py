"""Sphinx configuration of fednorm's documentation site: the guides (docs/*.md, the README) and
the API reference (docs/api/, generated from the docstrings).

Why Sphinx (autodoc + napoleon + MyST) rather than mkdocs + mkdocstrings: fednorm's docstrings
are reStructuredText with Google-style sections (``Args:``, ``Returns:``) and Sphinx roles
(``:class:``, ``:func:``, ``:mod:``), which autodoc renders as written and whose cross-references
Sphinx checks; mkdocstrings reads docstrings as Markdown, where every role and double-backquoted
literal renders wrong. MyST brings the Markdown guides into the same site, their links checked.

Build (``tests/test_docs_build.py`` runs exactly this; warnings are errors):

    python -m sphinx -W --keep-going -b html docs build/docs
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the working tree's fednorm, also without `pip install -e .`
os.environ.setdefault("OMP_NUM_THREADS", "1")

import fednorm  # noqa: E402  (after sys.path is set)

# Names that a package provides lazily through a module __getattr__ (fednorm.flower's, which
# import flwr only when used) are not in dir(package), where autodoc looks: bind them there.
for _package in ("fednorm", "fednorm.nn", "fednorm.methods", "fednorm.data", "fednorm.flower"):
    _module = importlib.import_module(_package)
    for _name in getattr(_module, "__all__", []):
        if _name not in vars(_module):
            setattr(_module, _name, getattr(_module, _name))

project = "fednorm"
author = "fednorm contributors"
release = version = fednorm.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",  # Google-style Args:/Returns:/Raises: sections
    "sphinx.ext.mathjax",
    "myst_parser",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# Every cross-reference must resolve: a reference to a fednorm name that the site does not
# document is a warning, and -W makes it an error. Names outside fednorm (torch, numpy, the
# standard library, pydantic, flwr) are documented elsewhere and intersphinx would need the network,
# so they, and only they, are listed here; so is the TypeVar of fednorm.registry, which is a
# typing device, not an object to document.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(torch|nn|F|np|numpy|flwr|yaml|pydantic|sklearn|matplotlib|PIL)(\..*)?"),
    (r"py:.*", r"(typing|types|collections|pathlib|os|io|enum|dataclasses|abc|functools|contextlib|argparse|logging)\..*"),
    (r"py:.*", r"(Any|Callable|Iterable|Iterator|Mapping|MutableMapping|Sequence|Optional|Union|Literal|Path|Tensor|Module|Parameter)"),
    (r"py:class", r"(int|float|complex|str|bool|bytes|dict|list|tuple|set|frozenset|object|type|None|NoneType|ellipsis)"),
    (r"py:class", r"fednorm\.registry\.T"),
]

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
# fednorm's docstrings never start with a signature, but @dataclass writes one into a class's
# missing docstring, and autodoc would take its string annotations for the real signature
autodoc_docstring_signature = False
autodoc_preserve_defaults = True  # `eps=1e-5`, not the float repr; a registry default, not its dict repr
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

myst_heading_anchors = 4  # GitHub-style heading anchors, which the guides' in-page links use
myst_enable_extensions = ["dollarmath"]

html_theme = "alabaster"
html_title = f"fednorm {release}"
html_theme_options = {"description": "normalization for federated learning", "fixed_sidebar": True}


# Files that other work is editing right now: a broken reference in their docstrings is not yet
# an error, and tests/test_docs_build.py does not yet check their docstrings for citations of
# spec/. TEMPORARY: the lead empties this list once those edits have landed (issue 38 item 5).
IN_PROGRESS = []  # files being rewritten elsewhere, whose docstring warnings are tolerated for now: none


def _in_progress(source: str | None) -> bool:
    """Whether a warning's source (``path:docstring of fednorm.api.run``) lies in :data:`IN_PROGRESS`.

    autodoc names the documented module's file for a re-exported object (``fednorm/__init__.py``
    for ``fednorm.api.run``), so the defining module is found from the object's dotted name.
    """
    path, _, dotted = (source or "").partition(":docstring of ")
    parts = dotted.strip().split(".")
    for cut in range(len(parts), 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is not None and getattr(module, "__file__", None):
            path = module.__file__
            break
    if not path:
        return False
    relative = Path(path).resolve().relative_to(ROOT).as_posix() if Path(path).resolve().is_relative_to(ROOT) else ""
    return any(relative == item or (item.endswith("/") and relative.startswith(item)) for item in IN_PROGRESS)


def _import(dotted: str) -> Any:
    """The object a dotted name denotes (``fednorm.api.run``), or None."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


def _documented_by_object(app: Any, env: Any) -> dict[int, str]:
    """id(object) -> the name the site documents it under (classes, functions, modules only)."""
    cache = getattr(app, "_fednorm_documented", None)
    if cache is None:
        cache = {}
        # more dots first: fednorm.data.FederatedData (full docs) wins over fednorm.FederatedData
        for name in sorted(env.get_domain("py").objects, key=lambda n: n.count("."), reverse=True):
            obj = _import(name) if name.startswith("fednorm") else None
            if obj is not None and (callable(obj) or inspect.ismodule(obj)):
                cache.setdefault(id(obj), name)
        app._fednorm_documented = cache
    return cache


def resolve_reference(app: Any, env: Any, node: Any, contnode: Any) -> Any:
    """Resolve a Python reference that the exact lookup missed, in two ways that cannot guess.

    1. By the object it names: docstrings cite the defining module (``fednorm.api.run``,
       ``fednorm.nn.functional.pooled_stats``) while the site documents the object where users
       import it (``fednorm.run``, ``fednorm.nn.pooled_stats``).
    2. By a unique suffix, Sphinx's own ``.name`` lookup: docstrings name objects as the code sees
       them (``:exc:`DatasetError``` in fednorm.data, a ``Raises: UnknownNameError:`` section).

    A name with no documented target still fails the build, one with several targets warns.
    """
    if node.get("refdomain") != "py":
        return None
    domain = env.get_domain("py")
    target = node["reftarget"]
    resolve = lambda name: domain.resolve_xref(  # noqa: E731
        env, node["refdoc"], app.builder, node["reftype"], name, node, contnode)
    obj = _import(target) if target.startswith("fednorm.") else None
    if obj is not None and (callable(obj) or inspect.ismodule(obj)):
        name = _documented_by_object(app, env).get(id(obj))
        if name is not None and name != target:
            return resolve(name)
    if node.get("refspecific"):
        return None
    node["refspecific"] = True
    return resolve(target)


def unchecked_in_progress(app: Any, domain: Any, node: Any) -> bool | None:
    """Keep quiet about a missing reference from a file in :data:`IN_PROGRESS`."""
    return True if _in_progress(node.source) else None


def _is_pydantic_model(obj: Any) -> bool:
    try:
        from pydantic import BaseModel
    except ImportError:
        return False
    return isinstance(obj, type) and issubclass(obj, BaseModel)


def class_signature(app: Any, what: str, name: str, obj: Any, options: Any, signature: str | None, ret: str | None) -> Any:
    """Two kinds of class signature that do not parse as Python, made to: a pydantic model's
    synthesized ``__init__``, whose fields have ``Annotated[...]`` types (shown as ``(**fields)``,
    the fields listed in the docstring instead), and a dataclass's ``<factory>`` default (shown as
    the factory's call, ``dict()``)."""
    if what != "class" or not signature:
        return None
    if _is_pydantic_model(obj):
        return "(**fields)", ret
    if dataclasses.is_dataclass(obj):
        # the __init__ parameters, so the <factory> placeholders, come in field order
        calls = iter([f"{getattr(f.default_factory, '__name__', 'factory')}()" for f in dataclasses.fields(obj)
                      if f.init and f.default_factory is not dataclasses.MISSING])
        return re.sub(r"<factory>", lambda _: next(calls, "..."), signature), ret
    return None


def pydantic_fields(app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """Append a pydantic model's fields (name, type, default, description) to its docstring."""
    if what != "class" or not _is_pydantic_model(obj):
        return
    lines += ["", "**Fields** (keyword arguments; also the keys of a ``config.yaml``):", ""]
    for field_name, field in obj.model_fields.items():
        annotation = re.sub(r"typing\.|<class '(\w+)'>", r"\1", str(field.annotation)).replace("`", "")
        default = "required" if field.is_required() else (
            f"``{field.default_factory()!r}``" if field.default_factory is not None else f"``{field.default!r}``")
        description = re.sub(r"(?<!`)`(?!`)", "``", field.description or "").replace("*", r"\*")
        lines += [f"* ``{field_name}`` (``{annotation}``, default {default}): {description}"]
    lines.append("")


def dataclass_docstring(app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    """Drop the docstring that ``@dataclass`` generates for a class without one: it repeats the
    signature, with string annotations (``'dict[str, Any]'``) that render as broken links."""
    if what == "class" and dataclasses.is_dataclass(obj) and (obj.__doc__ or "").startswith(f"{obj.__name__}("):
        lines.clear()


def drop_object_base(app: Any, name: str, obj: Any, options: Any, bases: list[Any]) -> None:
    """No "Bases: object" line: :show-inheritance: is for fednorm's own hierarchies (FedBN < FedAvg)."""
    if bases == [object]:
        bases.clear()


def readme_links(app: Any, relative_path: Path, parent_docname: str, content: list[str]) -> None:
    """README links to repository files that are not pages of this site (REPRODUCTION.md): shown
    as file names here, where a link would point nowhere."""
    if relative_path.name == "README.md":
        content[0] = re.sub(r"\[([^\]]+)\]\((?!https?:|#|docs/)[^)]+\)", r"`\1`", content[0])


def setup(app: Any) -> dict[str, Any]:
    app.connect("missing-reference", resolve_reference)
    app.connect("warn-missing-reference", unchecked_in_progress)
    app.connect("autodoc-process-docstring", dataclass_docstring)
    app.connect("autodoc-process-signature", class_signature)
    app.connect("autodoc-process-docstring", pydantic_fields)
    app.connect("autodoc-process-bases", drop_object_base)
    app.connect("include-read", readme_links)
    return {"parallel_read_safe": True}
