"""The API reference (docs/api.rst) documents every public function, class and method of cygemm.

Read from the rst and from the package itself, without running Sphinx. Public means:

- the names in ``__all__`` of ``cygemm``, ``cygemm.gemm_ops``, ``cygemm.nn`` and
  ``cygemm.backend`` (their submodules' names aside), and where torch is installed of
  ``cygemm.autograd`` and ``cygemm.autograd.ops``;
- in ``cygemm.dense``, ``fp8``, ``grouped``, ``elementwise``, ``graph``, ``tuning``, ``plans`` and
  ``rowmajor``, which have no ``__all__``: every function and class whose name has no leading
  underscore and that comes from a cygemm module whose name has none either (so ``fp8.quantize``,
  made in ``fp8_convert``, counts; ``tuning.SingleFlight``, from ``_timing``, does not), less
  the few that other cygemm modules call, listed in ``INTERNAL`` with the reason;
- of each public class, every method and property (inherited from a cygemm class too) whose
  name has no leading underscore, less the ``forward``/``backward`` hooks torch calls of a
  ``torch.autograd.Function`` (``TORCH_FUNCTION_HOOKS``).

An object is documented when an ``autofunction``/``autoclass``/``autoexception`` entry names it
under any of its names (``cygemm.dense.forward_into`` is ``cygemm.gemm_ops.forward_into``); a
member when its class's entry lists it in ``:members:`` or the class docstring names it in its
numpydoc ``Attributes`` section.

Every public function, method and class (its constructor) of two or more parameters has a
numpydoc ``Parameters`` section, or says its parameters are another's ("As :func:`...`").
"""
import importlib
import importlib.util
import inspect
import os
import re
import types

import pytest

import cygemm

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
API_RST = os.path.join(ROOT, "docs", "api.rst")

# A module of an optional dependency is checked where that dependency is installed (the GPU
# suite has torch and JAX; a machine without them cannot import cygemm.autograd or cygemm.jax).
from cygemm.__main__ import OPTIONAL_MODULES as OPTIONAL  # noqa: E402


def _installed(dep):
    try:
        return importlib.util.find_spec(dep) is not None
    except (ImportError, ValueError):
        return False


MISSING = {mod for mod, dep in OPTIONAL.items() if not _installed(dep)}

MODULES_WITH_ALL = ("cygemm", "cygemm.gemm_ops", "cygemm.nn", "cygemm.backend", "cygemm.tuning", "cygemm.plans",
                    "cygemm.graph", "cygemm.elementwise")
# cygemm.autograd's __all__ names its submodule ops, whose own __all__ holds the torch.compile entry points.
MODULES_WITH_ALL += tuple(m for m in ("cygemm.autograd", "cygemm.autograd.ops")
                          if not any(m == o or m.startswith(o + ".") for o in MISSING))
MODULES_WITHOUT_ALL = ("cygemm.dense", "cygemm.fp8", "cygemm.grouped", "cygemm.rowmajor")

# Public-looking names that are cygemm's own plumbing, called by its other modules: not API.
INTERNAL = {
}

# Classes users never construct themselves: their signature is not theirs to call.
NOT_CONSTRUCTED = {"Graph": "made by cygemm.graph.capture",
                   "Backend": "a typing.Protocol, which cannot be instantiated",
                   "MatmulFunction": "a torch.autograd.Function: called through apply, which its docstring shows",
                   "LinearFunction": "a torch.autograd.Function: called through apply, which its docstring shows"}

DIRECTIVE = re.compile(r"^\.\. auto(function|class|exception):: (\S+)\s*$")


def _entries():
    """{dotted name: (kind, [members] or None)} of the autodoc entries of docs/api.rst."""
    lines = open(API_RST, encoding="utf-8").read().splitlines()
    out = {}
    for i, line in enumerate(lines):
        m = DIRECTIVE.match(line)
        if not m:
            continue
        members = None
        j = i + 1
        while j < len(lines) and lines[j].startswith("   :"):
            opt = re.match(r"   :members:(.*)$", lines[j])
            if opt:
                text = opt.group(1)
                while j + 1 < len(lines) and lines[j + 1].startswith("      ") and lines[j + 1].strip():
                    j += 1                          # a members list continued on the next lines
                    text += " " + lines[j]
                members = [n.strip() for n in text.split(",") if n.strip()]
            j += 1
        assert m.group(2) not in out, f"docs/api.rst documents {m.group(2)} twice"
        out[m.group(2)] = (m.group(1), members)
    return out


def _resolve(dotted):
    """The object a dotted name of an entry names (None where nothing has that name): attributes
    first, so that ``cygemm.matmul`` is the function, not the module of that name."""
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        try:
            obj = importlib.import_module(".".join(parts[:i + 1]))
        except ImportError:
            return None
    return obj


def _is_api_object(obj):
    return inspect.isclass(obj) or callable(obj) and not isinstance(obj, types.ModuleType)


def _from_public_cygemm_module(obj):
    mod = getattr(obj, "__module__", None) or ""
    parts = mod.split(".")
    return parts[0] == "cygemm" and parts[1:2] != ["engine"] and not any(p.startswith("_") for p in parts)


def public_objects():
    """{public dotted name: object} over the public modules (see the module docstring)."""
    out = {}
    for name in MODULES_WITH_ALL:
        mod = importlib.import_module(name)
        for attr in mod.__all__:
            obj = getattr(mod, attr)
            if _is_api_object(obj):
                out[f"{name}.{attr}"] = obj
    for name in MODULES_WITHOUT_ALL:
        mod = importlib.import_module(name)
        for attr, obj in vars(mod).items():
            dotted = f"{name}.{attr}"
            if (not attr.startswith("_") and _is_api_object(obj) and _from_public_cygemm_module(obj)
                    and dotted not in INTERNAL):
                out[dotted] = obj
    return out


# torch calls these of a torch.autograd.Function subclass (its users call ``apply``): torch's
# interface, documented by torch, not cygemm's API.
TORCH_FUNCTION_HOOKS = ("forward", "backward")


def _is_torch_function(cls):
    return any(k.__name__ == "Function" and (k.__module__ or "").startswith("torch.autograd") for k in cls.__mro__)


def public_members(cls):
    """{name: attribute} of cls's public methods and properties, from cygemm's classes only."""
    out = {}
    hooks = TORCH_FUNCTION_HOOKS if _is_torch_function(cls) else ()
    for klass in reversed(cls.__mro__):
        if not (getattr(klass, "__module__", "") or "").startswith("cygemm"):
            continue
        for name, attr in vars(klass).items():
            if name.startswith("_") or name in hooks:
                continue
            if isinstance(attr, (staticmethod, classmethod)):
                attr = attr.__func__
            if callable(attr) or isinstance(attr, (property, types.GetSetDescriptorType,
                                                   types.MemberDescriptorType)):
                out[name] = attr
    return out


def attributes_section(cls):
    """The names of the numpydoc "Attributes" section of cls's docstring."""
    doc = inspect.getdoc(cls) or ""
    m = re.search(r"^Attributes\n-+\n(.*?)(?:\n\S[^\n]*\n-+\n|\Z)", doc, re.S | re.M)
    if not m:
        return set()
    names = set()
    for line in m.group(1).splitlines():
        if line and not line[0].isspace():
            names.update(n.strip() for n in line.split(":")[0].split(","))
    return names


ENTRIES = {name: entry for name, entry in _entries().items()
           if not any(name.startswith(mod + ".") for mod in MISSING)}
DOCUMENTED = {name: _resolve(name) for name in ENTRIES}
PUBLIC = public_objects()
PUBLIC_CLASSES = {name: obj for name, obj in PUBLIC.items() if inspect.isclass(obj)}


def _entry_of(obj):
    """The api.rst entry that documents obj, or None."""
    for name, documented in DOCUMENTED.items():
        if documented is obj:
            return name
    return None


def test_the_autodoc_defaults_leave_the_members_lists_in_force():
    # autodoc_default_options = {"members": False} overrode every entry's :members: list:
    # the pages showed classes without a method.
    ns = {"__file__": os.path.join(ROOT, "docs", "conf.py")}
    exec(compile(open(ns["__file__"]).read(), ns["__file__"], "exec"), ns)
    assert "members" not in ns.get("autodoc_default_options", {})


def test_every_entry_names_an_existing_object():
    missing = [name for name, obj in DOCUMENTED.items() if obj is None]
    assert not missing, f"docs/api.rst documents names that do not exist: {missing}"


def test_the_public_api_is_what_this_test_expects():
    # A guard against an empty introspection passing the tests below vacuously.
    for name in ("cygemm.matmul", "cygemm.GemmPlan", "cygemm.fp8.scaled_matmul", "cygemm.grouped.last_route",
                 "cygemm.nn.TrainStep", "cygemm.backend.CUDABackend", "cygemm.graph.Graph",
                 "cygemm.tuning.force_routes", "cygemm.dense.layer_shape"):
        assert name in PUBLIC, name
    assert {"plan", "autotune", "execute", "close", "route"} <= set(public_members(cygemm.GemmPlan))
    assert {"asarray", "matmul", "softmax", "ridge", "synchronize"} <= set(public_members(PUBLIC["cygemm.backend.CUDABackend"]))


def test_every_public_function_and_class_is_documented():
    missing = sorted(name for name, obj in PUBLIC.items() if _entry_of(obj) is None)
    assert not missing, f"public but missing from docs/api.rst: {missing}"


@pytest.mark.parametrize("name", sorted(PUBLIC_CLASSES))
def test_every_public_method_and_property_is_documented(name):
    cls = PUBLIC_CLASSES[name]
    entry = _entry_of(cls)
    assert entry is not None, f"{name} is missing from docs/api.rst"
    listed = set(ENTRIES[entry][1] or ())
    in_docstring = attributes_section(cls)
    members = public_members(cls)
    missing = sorted(set(members) - listed - in_docstring)
    assert not missing, f"{entry}: public members missing from its :members: in docs/api.rst: {missing}"
    unknown = sorted(listed - set(members))
    assert not unknown, f"{entry}: :members: names what the class does not have: {unknown}"


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_every_documented_object_and_member_has_a_docstring(name):
    obj = DOCUMENTED[name]
    assert obj is not None, name
    assert (inspect.getdoc(obj) or "").strip(), f"{name} has no docstring"
    for member in ENTRIES[name][1] or ():
        attr = inspect.getattr_static(obj, member)
        attr = attr.__func__ if isinstance(attr, (staticmethod, classmethod)) else attr
        doc = inspect.getdoc(attr) if callable(attr) else getattr(attr, "__doc__", None)
        if not doc:   # a method without its own docstring inherits the overridden one's
            doc = inspect.getdoc(getattr(obj, member))
        assert (doc or "").strip(), f"{name}.{member} has no docstring"


@pytest.mark.parametrize("name", sorted(n for n, (kind, _) in ENTRIES.items() if kind == "class"))
def test_every_documented_class_shows_how_to_construct_it(name):
    cls = DOCUMENTED[name]
    if cls.__name__ in NOT_CONSTRUCTED:
        return
    try:
        inspect.signature(cls)
    except (TypeError, ValueError):
        # A Cython class: autodoc reads the signature from the docstring's first line.
        first = (cls.__doc__ or "").lstrip().splitlines()[0] if (cls.__doc__ or "").strip() else ""
        assert first.startswith(f"{cls.__name__}(") and first.endswith(")"), (
            f"{name}: no introspectable signature, and the docstring does not start with one")


PARAMETERS = re.compile(r"^Parameters\n-+$", re.M)
# A docstring that gives all its parameters as another documented callable's.
AS_ANOTHER = re.compile(r"^As :(func|meth):`", re.M)


def _parameters(obj, is_method):
    """obj's parameters by inspect.signature (self or cls of a method left out), or None where
    it has no introspectable signature."""
    try:
        params = list(inspect.signature(obj).parameters.values())
    except (TypeError, ValueError):
        return None
    if is_method and params and params[0].name in ("self", "cls"):
        params = params[1:]
    return params


def _lacks_parameters_section(obj, doc, is_method):
    params = _parameters(obj, is_method)
    if params is None or len(params) < 2:
        return False
    return not PARAMETERS.search(doc) and not AS_ANOTHER.search(doc)


def test_every_public_callable_with_parameters_documents_them():
    # A function, method or class (its constructor) of two or more parameters says what each is
    # in a numpydoc "Parameters" section, or says they are another's ("As :func:`...`").
    # Exempt: exception classes, and the classes of NOT_CONSTRUCTED (no signature of theirs).
    missing = []
    for name, obj in sorted(PUBLIC.items()):
        if inspect.isclass(obj):
            if issubclass(obj, BaseException):
                continue
            if obj.__name__ not in NOT_CONSTRUCTED and _lacks_parameters_section(obj, inspect.getdoc(obj) or "",
                                                                                  False):
                missing.append(name)
            for member, attr in sorted(public_members(obj).items()):
                if not callable(attr):          # a property
                    continue
                static = isinstance(inspect.getattr_static(obj, member), staticmethod)
                doc = inspect.getdoc(attr) or inspect.getdoc(getattr(obj, member)) or ""
                if _lacks_parameters_section(attr, doc, not static):
                    missing.append(f"{name}.{member}")
        elif _lacks_parameters_section(obj, inspect.getdoc(obj) or "", False):
            missing.append(name)
    assert not missing, f"no Parameters section in their docstrings: {missing}"
