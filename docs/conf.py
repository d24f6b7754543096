"""Sphinx configuration: the API reference, docs/*.md and the teaching notebooks in one site.

Build it (the notebooks are executed, so readers see their outputs and plots)::

    pip install -e ".[docs,examples]"
    sphinx-build -W --keep-going -b html docs docs/_build/html

The test ``tests/docs/test_api_reference.py`` builds the same site with warnings as errors but with
``-D nb_execution_mode=off``: ``tests/examples`` already executes the notebooks, and executing them
twice would make the test slower and would start their rank processes from the test.

The reference follows the package as files move: ``docs/api/index.rst`` asks autosummary for
``neural_arch`` with ``:recursive:``, and ``_templates/autosummary/module.rst`` writes each module's
page from :func:`public_api`, the one rule for what a module makes public.
"""

from __future__ import annotations

import bisect
import importlib
import inspect
import pkgutil
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

project = "neural_arch"
author = "neural_arch contributors"
copyright = "neural_arch contributors"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "myst_nb",  # MyST Markdown for docs/*.md and the .ipynb notebooks
]

root_doc = "index"
# the notebooks' README links to the .ipynb files by their path in the repository; index.md lists them
exclude_patterns = ["_build", "notebooks/README.md", "**/.ipynb_checkpoints"]
templates_path = ["_templates"]
html_theme = "alabaster"
html_static_path: list[str] = []

# -- API reference -------------------------------------------------------------------------------------
autosummary_generate = True
autosummary_ignore_module_all = False
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
napoleon_google_docstring = True
napoleon_numpy_docstring = True
napoleon_use_rtype = False
add_module_names = False

# Every cross-reference must resolve, so a renamed or moved name fails the build instead of leaving a
# dead link. Only types that belong to other projects (which this site does not describe) are exempt.
nitpicky = True
_EXTERNAL_PREFIXES = (
    "np.", "numpy.", "cupy.", "cp.", "mpi4py.", "ml_dtypes.", "typing.", "collections.abc.",
    "concurrent.", "threading.", "socket.", "multiprocessing.", "os.", "pathlib.", "io.", "enum.",
    "contextlib.", "types.", "subprocess.", "selectors.", "abc.", "logging.", "argparse.",
    "queue.", "weakref.", "dataclasses.", "functools.", "tensorboardX.", "_io.", "_thread.",
    "numpy.typing.", "npt.", "datetime.", "signal.", "mmap.", "asyncio.",
)
_EXTERNAL_NAMES = {
    "np", "numpy", "cupy", "ndarray", "ArrayLike", "DTypeLike", "NDArray", "dtype", "Any", "Callable",
    "Iterable", "Iterator", "Sequence", "Mapping", "MutableMapping", "Generator", "Optional", "Union",
    "Path", "PathLike", "Thread", "Event", "Lock", "socket", "Enum", "IntEnum", "TextIO", "BinaryIO",
    "Self", "TypeVar", "T", "array", "array-like", "optional", "callable", "iterable", "module",
    "default", "ellipsis", "EllipsisType", "NoneType", "Ellipsis", "Popen", "Queue", "Executor",
    "Future", "ContextManager", "AbstractContextManager", "Protocol", "Literal", "ClassVar",
}
_STDLIB = sorted(name for name in sys.stdlib_module_names if not name.startswith("_"))
nitpick_ignore_regex = [
    (r"py:.*", "({}).*".format("|".join(re.escape(p) for p in _EXTERNAL_PREFIXES))),
    (r"py:.*", r"({})(\..*)?".format("|".join(_STDLIB))),
    (r"py:.*", "({})".format("|".join(re.escape(n) for n in sorted(_EXTERNAL_NAMES, key=len, reverse=True)))),
    # a private name (a base class such as nn.batchnorm._BatchNorm, shown by show-inheritance) is left
    # out of the reference on purpose
    (r"py:.*", r"(.*\.)?_[A-Za-z]\w*(\..*)?"),
]

# -- MyST and notebooks --------------------------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "colon_fence"]
myst_heading_anchors = 3
# "auto": a notebook stored without outputs is executed at build time (all of ours are); the test
# builds with -D nb_execution_mode=off
nb_execution_mode = "auto"
nb_execution_timeout = 600
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_kernel_rgx_aliases = {".*": "python3"}

# the helpers below live in the configuration; Sphinx need not cache them between builds
suppress_warnings = ["config.cache"]


def _is_public_module(modname: str) -> bool:
    return modname.startswith("neural_arch") and not any(p.startswith("_") for p in modname.split("."))


def _kind(obj) -> str:
    if inspect.isclass(obj):
        kind = "exception" if issubclass(obj, BaseException) else "class"
    elif inspect.isroutine(obj) or callable(obj) and hasattr(obj, "__wrapped__"):
        kind = "function"
    else:
        return "data"
    # another project's class or function (numpy's dtype re-exported as neural_arch.dtype) is named,
    # not described: its docstring is that project's, written for its own reference
    return kind if str(getattr(obj, "__module__", "")).startswith("neural_arch") else "external"


def _defined_in(obj) -> str | None:
    return getattr(obj, "__module__", None) if _kind(obj) in ("class", "exception", "function") else None


def public_names(modname: str) -> list[str]:
    """The names ``modname`` makes public: its ``__all__``, else the classes and functions defined in it
    (imports and underscored names excluded; submodules are not names here).

    Example::

        >>> "Tensor" in public_names("neural_arch.core.tensor")
        True
    """
    module = importlib.import_module(modname)
    declared = getattr(module, "__all__", None)
    if declared is not None:
        names = [n for n in declared if not inspect.ismodule(getattr(module, n, None))]
        return list(dict.fromkeys(names))
    return [
        name for name, obj in vars(module).items()
        if not name.startswith("_") and _defined_in(obj) == modname
    ]


def public_api(modname: str) -> list[tuple[str, str, str | None]]:
    """``(name, kind, home)`` for every public name of ``modname``: ``home`` is the public module whose
    page describes the object (a re-export links there), or ``None`` when this page describes it.
    ``kind`` is ``class``, ``exception``, ``function``, ``data`` (a value with a ``#:`` comment or a
    docstring after it in the source), ``value`` (a value without one: its type's docstring is not its
    own) or ``external`` (another project's class or function).

    Example::

        >>> ("Tensor", "class", None) in public_api("neural_arch.core.tensor")
        True
    """
    module = importlib.import_module(modname)
    entries = []
    for name in public_names(modname):
        if not hasattr(module, name):
            # a dangling __all__ entry: autodata's import warning fails the build and names it
            entries.append((name, "data", None))
            continue
        obj = getattr(module, name)
        kind = _kind(obj)
        if kind == "data" and ("", name) not in _attribute_docs(modname):
            kind = "value"
        home = _defined_in(obj)
        if (
            home is None or home == modname or not _is_public_module(home)
            or getattr(obj, "__name__", None) != name or name not in public_names(home)
        ):
            home = None
        entries.append((name, kind, home))
    return entries


def submodules(pkgname: str) -> tuple[list[str], list[str]]:
    """The public submodules of package ``pkgname`` (short names), split in two: those autosummary can
    reach by name, and those *shadowed* by a same-named attribute of the package
    (none today: ``tests/architecture`` forbids it, but a shadowed page would still be written by
    :func:`_prepare_generated_pages`).

    Example::

        >>> submodules("neural_arch.profiler")
        (['chrome', 'clock', 'events', 'profiler', 'recorder'], [])
    """
    package = importlib.import_module(pkgname)
    reachable, shadowed = [], []
    for info in pkgutil.iter_modules(getattr(package, "__path__", [])):
        if info.name.startswith("_"):
            continue
        attribute = getattr(package, info.name, None)
        if attribute is not None and not inspect.ismodule(attribute):
            shadowed.append(info.name)
        else:
            reachable.append(info.name)
    return reachable, shadowed


def _attribute_docs(modname: str) -> dict:
    from sphinx.pycode import ModuleAnalyzer, PycodeError

    try:
        return ModuleAnalyzer.for_module(modname).find_attr_docs()
    except PycodeError:
        return {}


def type_of(modname: str, name: str) -> str:
    """How the reference names what ``modname.name`` is: another project's class or function by its
    ``module.qualname``, a value by its type's qualified name.

    Example::

        >>> type_of("neural_arch", "dtype")
        'numpy.dtype'
    """
    obj = getattr(importlib.import_module(modname), name)
    if not (inspect.isclass(obj) or callable(obj)):
        obj = type(obj)
    module = getattr(obj, "__module__", None)
    return f"{module}.{obj.__qualname__}" if module not in (None, "builtins") else obj.__qualname__


def _public_modules(root: str = "neural_arch"):
    yield root
    reachable, shadowed = submodules(root)
    for name in reachable + shadowed:
        yield from _public_modules(f"{root}.{name}")


def _register_reexported_names(app, env):
    # a re-export is described once, on its home page; its public path (neural_arch.distributed.
    # DistributedDataParallel, the path users and docstrings write) becomes an *aliased* target of that
    # description, so references by either path resolve, and a short name that matches both resolves to
    # the home without an "ambiguous reference" warning
    from sphinx.domains.python import ObjectEntry

    objects = env.get_domain("py").objects
    described = sorted(objects)
    for modname in _public_modules():
        for name, _kind_name, home in public_api(modname):
            if not home:
                continue
            # the object itself and, for a class, its described members (nn.MultiheadAttention.forward)
            home_path, public_path = f"{home}.{name}", f"{modname}.{name}"
            # sorted: "home.name" is followed by every "home.name.member" (no identifier character
            # sorts before ".")
            for target in described[bisect.bisect_left(described, home_path):]:
                if target != home_path and not target.startswith(home_path + "."):
                    break
                alias = public_path + target[len(home_path):]
                if alias not in objects:
                    entry = objects[target]
                    objects[alias] = ObjectEntry(entry.docname, entry.node_id, entry.objtype, True)


autosummary_context = {"public_api": public_api, "submodules": submodules, "type_of": type_of}


def _prepare_generated_pages(app):
    # Runs before autosummary writes its pages. (1) A page left by a module that moved or went away
    # would be read as a document and fail the build: remove the pages of modules that no longer exist.
    # (2) autosummary imports a submodule shadowed by a same-named attribute of its package as that
    # attribute, so it cannot write the module's page: write it here from the same template.
    from sphinx.ext.autosummary.generate import AutosummaryRenderer, generate_autosummary_content

    out = Path(app.srcdir, "api", "generated")
    out.mkdir(parents=True, exist_ok=True)
    modules = set(_public_modules())
    for page in out.glob("*.rst"):
        if page.stem not in modules:
            page.unlink()
    renderer = AutosummaryRenderer(app)
    for pkgname in modules:
        for name in submodules(pkgname)[1]:
            modname = f"{pkgname}.{name}"
            module = importlib.import_module(modname)
            content = generate_autosummary_content(
                modname, module, importlib.import_module(pkgname), renderer, "module", False, True,
                dict(app.config.autosummary_context), pkgname, name, config=app.config, events=app.events,
            )
            page = out / f"{modname}.rst"
            if not page.exists() or page.read_text() != content:
                page.write_text(content)


def _skip_private_members(app, what, name, obj, skip, options):
    # names that start with an underscore stay private in the reference, __init__ included: its
    # parameters are documented in the class docstring (napoleon's "Args")
    return True if name.startswith("_") else None


def setup(app):
    app.connect("autodoc-skip-member", _skip_private_members)
    app.connect("builder-inited", _prepare_generated_pages, priority=400)
    app.connect("env-updated", _register_reexported_names)
