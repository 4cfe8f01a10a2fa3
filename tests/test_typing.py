"""CPU: cygemm.typing, the types cygemm's stubs share.

Its Literal types name exactly the values the runtime accepts (the settings' autotune and
determinism tables and the per-call checks, the math names the entries accept, the epilogue
table's activations); its Protocols recognise the objects cygemm takes as arrays and streams;
and every stub takes these types from it, by the names it exports, for the parameters they are
meant for. (That Activation is the epilogue table is tests/contracts/test_tables.py's.)
"""
import ast
import glob
import os
import re
import typing
from typing import Literal

import pytest

import cygemm
from cygemm.engine import settings as _settings
from cygemm import typing as ctyping
from fakes import BASE, FakeDeviceArray

PACKAGE = os.path.dirname(cygemm.__file__)
SHARED = set(ctyping.__all__)


def literal_values(tp):
    """The values a Literal, or a Union / Optional of Literals, admits (None for Optional)."""
    if typing.get_origin(tp) is Literal:
        return set(typing.get_args(tp))
    values = set()
    for arg in typing.get_args(tp):
        if arg is type(None):
            values.add(None)
        else:
            values |= literal_values(arg)
    return values


def quoted(message):
    """The 'quoted' words of an error message's "expected ..." part."""
    return set(re.findall(r"'(\w+)'", message.split(", got")[0]))


def _fakes():
    return (FakeDeviceArray((2, 2), ptr=BASE), FakeDeviceArray((2, 2), ptr=BASE + 4096),
            FakeDeviceArray((2, 2), ptr=BASE + 8192))


def _stubs():
    paths = sorted(glob.glob(os.path.join(PACKAGE, "**", "*.pyi"), recursive=True))
    assert len(paths) >= 20, paths
    return [(os.path.relpath(p, PACKAGE), ast.parse(open(p).read())) for p in paths]


def _parameters(tree):
    """(function name, parameter name, annotation source) of every annotated parameter."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            args = node.args
            for a in args.posonlyargs + args.args + args.kwonlyargs:
                if a.annotation is not None:
                    yield node.name, a.arg, ast.unparse(a.annotation)


# ---------------------------------------------------------------- the literals against the runtime

def test_autotune_names_the_settings_values_and_none_the_per_call_default():
    values = literal_values(ctyping.Autotune)
    assert None in values                                    # per call: the option's
    assert values - {None} == set(_settings._AUTOTUNE)
    with pytest.raises(ValueError) as option:
        cygemm.set_options(autotune="fastest")
    assert quoted(str(option.value)) == values - {None}
    with pytest.raises(ValueError) as call:
        cygemm.gemm(*_fakes(), autotune="fastest")
    assert quoted(str(call.value)) == values - {None} and "None" in str(call.value)
    old = cygemm.get_options()["autotune"]
    try:
        for v in values - {None}:
            cygemm.set_options(autotune=v)
            assert cygemm.get_options()["autotune"] == v
    finally:
        cygemm.set_options(autotune=old)


def test_determinism_names_the_settings_values_and_none_the_per_call_default():
    values = literal_values(ctyping.Determinism)
    assert None in values
    assert values - {None} == set(_settings._DETERMINISM)
    with pytest.raises(ValueError) as option:
        cygemm.set_options(determinism="bitwise")
    assert quoted(str(option.value)) == values - {None}
    with pytest.raises(ValueError) as call:
        cygemm.matmul(*_fakes(), determinism="bitwise")
    assert quoted(str(call.value)) == values - {None} and "None" in str(call.value)
    old = cygemm.get_options()["determinism"]
    try:
        for v in values - {None}:
            cygemm.set_options(determinism=v)
            assert cygemm.get_options()["determinism"] == v
    finally:
        cygemm.set_options(determinism=old)


def test_matmul_math_is_what_the_entries_accept_and_math_a_part_of_it():
    for entry in (cygemm.matmul, cygemm.gemm):
        with pytest.raises(ValueError) as info:
            entry(*_fakes(), math="fp16")
        assert str(info.value).startswith("math: expected ")
        assert quoted(str(info.value)) == literal_values(ctyping.MatmulMath), entry.__name__
    assert literal_values(ctyping.Math) <= literal_values(ctyping.MatmulMath)
    assert {"tf32", "fp32"} <= literal_values(ctyping.Math)


def test_every_typed_activation_parses_and_stub_literals_name_only_those():
    from cygemm.engine.epilogues import ACTIVATIONS, parse_activation
    typed = literal_values(ctyping.Activation)
    for name in typed:
        assert parse_activation(name) == ACTIVATIONS[name], name
    found = 0
    for path, tree in _stubs():
        for fn, arg, annotation in _parameters(tree):
            if arg == "act" and annotation.startswith("Literal["):
                values = set(ast.literal_eval(annotation[len("Literal"):]))
                assert values <= typed, (path, fn, values - typed)
                found += 1
    assert found >= 2            # (fp8's scaled_matmul and GemmPlan narrow the activations)


# ---------------------------------------------------------------- the protocols

def test_protocols_recognise_the_arrays_and_streams_cygemm_takes():
    class DLPackOnly:
        def __dlpack__(self, *args, **kwargs):
            return None

        def __dlpack_device__(self):
            return (2, 0)

    class CoreStream:
        def __cuda_stream__(self):
            return (0, 0x1234)

    fake = FakeDeviceArray((3, 4))
    assert isinstance(fake, ctyping.CudaArrayInterface) and not isinstance(fake, ctyping.DLPackArray)
    assert isinstance(DLPackOnly(), ctyping.DLPackArray) and not isinstance(DLPackOnly(), ctyping.CudaArrayInterface)
    assert isinstance(CoreStream(), ctyping.CudaStreamProtocol)
    for plain in (object(), 3, [1, 2]):
        assert not isinstance(plain, (ctyping.CudaArrayInterface, ctyping.DLPackArray, ctyping.CudaStreamProtocol))
    assert set(typing.get_args(ctyping.DeviceArray)) == {ctyping.CudaArrayInterface, ctyping.DLPackArray}
    # What the protocol describes is what cygemm reads: the stream it names, no GPU needed.
    assert cygemm.stream_pointer(CoreStream()) == 0x1234
    assert type(None) in typing.get_args(ctyping.StreamLike) and int in typing.get_args(ctyping.StreamLike)


def test_the_module_exports_each_type_it_defines_and_imports_only_typing():
    tree = ast.parse(open(ctyping.__file__).read())
    defined = set()
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    assert defined - {"__all__"} == SHARED
    for name in SHARED:
        assert getattr(ctyping, name) is not None, name
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            modules.add(node.module)
        elif isinstance(node, ast.Import):
            modules |= {a.name for a in node.names}
    assert modules == {"typing"}, modules     # no array library imported to describe their arrays


# ---------------------------------------------------------------- the stubs use them

def test_every_stub_takes_the_shared_types_from_this_module_and_redefines_none():
    importers = 0
    for path, tree in _stubs():
        imported = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "cygemm.typing":
                imported |= {a.name for a in node.names}
        assert imported <= SHARED, (path, imported - SHARED)
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id in SHARED}
        assert used <= imported, f"{path} uses {sorted(used - imported)} without importing it from cygemm.typing"
        redefined = {t.id for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.AnnAssign))
                     for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
        redefined |= {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
        assert not redefined & SHARED, (path, redefined & SHARED)
        importers += bool(imported)
    assert importers >= 15, importers


# A parameter of one of these names takes the shared type (the settings' set_options takes the
# option's value, never None: a plain str).
PARAMETER_TYPES = {"stream": {"StreamLike"}, "autotune": {"Autotune"}, "determinism": {"Determinism"},
                   "math": {"Math", "MatmulMath"}}
# set_options sets an option's value: None is no value there (it is "the option's" in a call).
OWN_TYPES = {("engine/settings.pyi", "set_options", "autotune"), ("engine/settings.pyi", "set_options", "determinism")}


def test_stub_parameters_named_for_a_shared_type_are_annotated_with_it():
    seen = {name: 0 for name in PARAMETER_TYPES}
    for path, tree in _stubs():
        for fn, arg, annotation in _parameters(tree):
            if arg in PARAMETER_TYPES and (path, fn, arg) not in OWN_TYPES:
                assert annotation in PARAMETER_TYPES[arg], f"{path}: {fn}({arg}: {annotation})"
                seen[arg] += 1
    assert all(n >= 3 for n in seen.values()), seen


def test_nns_precision_literal_is_its_table_and_aliases():
    import typing
    from cygemm.nn import _storage
    assert set(typing.get_args(_storage.Precision)) == set(_storage.PRECISIONS) | {"bf16", "float32"}
    for name in typing.get_args(_storage.Precision):
        assert _storage.parse_precision(name) in _storage.PRECISIONS
