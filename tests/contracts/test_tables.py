"""One source per table (CPU, source only): dtype names and FP8 formats are spelt as data only in
the dtype table (cygemm/engine/dtypes.*), activation and epilogue names only in the epilogue
table (cygemm/engine/epilogues.*). Everywhere else they come from those tables.

What counts as spelling a name: a string literal that is a name ("bfloat16", "e4m3", "gelu"), or
one that lists three or more names (an error's "float16, bfloat16 or float32", which must be
built from the table so that it stays true when a row is added). Not counted: docstrings, the
defaults of a public signature (``format="e4m3"``: what the user types), and prose that names
one or two of them. nn/ and backend/ are applications written on the public API; their own
defaults are theirs, so they are not scanned.
"""
import glob
import io
import os
import re
import sys
import tokenize

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
PACKAGE = os.path.join(ROOT, "cygemm")
if not os.path.isdir(os.path.join(PACKAGE, "engine")):
    pytest.skip("needs the source tree (cygemm/ beside tests/)", allow_module_level=True)

DTYPE_NAMES = ("float16", "bfloat16", "float32", "float64", "complex64", "complex128", "int8", "int32",
               "float8_e4m3fn", "float8_e5m2", "uint8", "e4m3", "e5m2")
ACTIVATION_NAMES = ("none", "identity", "relu", "leaky_relu", "gelu", "gelu_erf", "sigmoid", "tanh", "silu",
                    "relu_bias", "gelu_bias")
# "none" is also an option's word (autotune="none"), so only lists count it.
AMBIGUOUS = ("none",)
NOT_SCANNED = ("nn", "backend", "bindings", "kernels")
# typing.py spells the activations' Literal for mypy, which cannot read a table; a test below
# holds it equal to the table.
NOT_SCANNED_FILES = ("__main__.py", "typing.py")
# `name: type = "default"`: a NamedTuple's or dataclass's public default.
_ANNOTATED_DEFAULT = re.compile(r"^\s*\w+\s*:\s*[\w\[\], .]+=\s*$")
_DOC_NEIGHBOURS = (tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT)


def _sources(skip_table):
    for folder, dirs, files in os.walk(PACKAGE):
        rel = os.path.relpath(folder, PACKAGE)
        if rel.split(os.sep)[0] in NOT_SCANNED:
            continue
        for f in sorted(files):
            if f.endswith((".py", ".pyx")) and f.split(".")[0] != skip_table and f not in NOT_SCANNED_FILES:
                yield os.path.join(folder, f)


def _literals(path):
    """(line, text) of each string literal that is not a docstring nor in a def's signature."""
    lines = open(path).read().splitlines(True)
    toks = list(tokenize.generate_tokens(io.StringIO("".join(lines)).readline))
    depth, in_signature = 0, False
    middle = getattr(tokenize, "FSTRING_MIDDLE", None)
    for i, t in enumerate(toks):
        if t.type == tokenize.NAME and t.string in ("def", "cpdef"):
            in_signature, depth = True, 0
        elif in_signature and t.type == tokenize.OP and t.string in "([{":
            depth += 1
        elif in_signature and t.type == tokenize.OP and t.string in ")]}":
            depth -= 1
            in_signature = depth > 0
        if in_signature or t.type not in (tokenize.STRING, middle):
            continue
        before = toks[i - 1].type if i else tokenize.NEWLINE
        after = toks[i + 1].type if i + 1 < len(toks) else tokenize.NEWLINE
        if t.type == tokenize.STRING and before in _DOC_NEIGHBOURS and after in _DOC_NEIGHBOURS:
            continue            # a docstring
        if _ANNOTATED_DEFAULT.match(lines[t.start[0] - 1][:t.start[1]]):
            continue
        body = re.sub(r"^[rbfuRBFU]*('''|\"\"\"|'|\")|('''|\"\"\"|'|\")$", "", t.string)
        yield t.start[0], body


def spelt(names, skip_table, ambiguous=()):
    word = re.compile(r"(?<![\w.])(" + "|".join(names) + r")(?![\w(])")
    found = []
    for path in _sources(skip_table):
        for line, body in _literals(path):
            hits = set(word.findall(body))
            if (body in names and body not in ambiguous) or len(hits) >= 3:
                found.append(f"{os.path.relpath(path, ROOT)}:{line}: {body[:90]!r}")
    return found


def test_dtype_names_are_spelt_only_in_the_dtype_table():
    assert spelt(DTYPE_NAMES, "dtypes") == []


def test_activation_names_are_spelt_only_in_the_epilogue_table():
    assert spelt(ACTIVATION_NAMES, "epilogues", AMBIGUOUS) == []


def test_the_typed_activation_names_are_the_tables():
    import typing

    from cygemm.engine.epilogues import ACTIVATIONS
    from cygemm.typing import Activation
    assert set(typing.get_args(Activation)) == set(ACTIVATIONS)


def test_the_scan_finds_what_it_looks_for(tmp_path, monkeypatch):
    """The detector itself: a name as data and a hand-written list are found; a docstring, a
    signature's default and prose naming one type are not."""
    src = tmp_path / "cygemm" / "mod.py"
    src.parent.mkdir()
    src.write_text('"""Takes float16, bfloat16 or float32."""\n'
                   'def f(dtype="float32"):\n'
                   '    """Doc: bfloat16, float16, float32."""\n'
                   '    x = "bfloat16"\n'
                   '    raise TypeError(f"a: expected float16, bfloat16 or float32, got {dtype}")\n'
                   '    raise TypeError("the int8 GEMM writes int32")\n')
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", str(src.parent))
    found = [f.split(":")[1] for f in spelt(DTYPE_NAMES, "dtypes")]
    assert found == ["4", "5"]


def test_no_storage_type_is_compared_with_a_cuda_constant_outside_the_table():
    """A storage type's facts (promotion, FP8 outputs' C and bias types, which FP8 types pair,
    the K-tail guard's types, the 16-bit and TF32 types) are the dtype table's fields, and the
    types a role fixes (scales are float32; the int8 GEMM's int8 and int32) are named once
    beside it (SCALES_DTYPE, INT8_DTYPE, INT8_SUMS_DTYPE): no Cython source compares a type with
    a CUDA_R_* / CUDA_C_* constant but cygemm/engine/dtypes.pxd. (The kernels' C dispatch on the
    type they run is theirs.)"""
    compare = re.compile(r"[=!]=\s*CUDA_[RC]_\w+|CUDA_[RC]_\w+\s*[=!]=|\bin\s*\([^)]*CUDA_[RC]_")
    found = {}
    for ext in ("pyx", "pxd"):
        for path in glob.glob(os.path.join(PACKAGE, "**", f"*.{ext}"), recursive=True):
            rel = os.path.relpath(path, PACKAGE).replace(os.sep, "/")
            if rel == "engine/dtypes.pxd":
                continue
            n = sum(1 for line in open(path) if compare.search(line.split("#")[0]))
            if n:
                found[rel] = n
    assert not found, f"comparisons with a CUDA_R_* constant (ask the dtype table instead): {found}"


def test_tests_take_cudadatatype_numbers_from_the_table():
    """A test names a storage type by the table's row (BY_ANY_NAME[name]["cuda"]), never by its
    cudaDataType number."""
    numbers = re.compile(r"=\s*\(?\s*0\s*,\s*1\s*,\s*2\s*,\s*14\b|\"bfloat16\":\s*\(14\b")
    hard = [os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "tests", "**", "*.py"), recursive=True)
            if numbers.search(open(p).read())]
    assert not hard, hard


def test_the_kernels_activation_list_is_the_enum():
    """include/cygemm/kernels.h's CYGEMM_ACTIVATIONS lists every activation code but NONE, once,
    and elementwise.cu's launchers instantiate their kernels from it (no switch spells them)."""
    header = open(os.path.join(ROOT, "include", "cygemm", "kernels.h")).read()
    enum = re.findall(r"CYGEMM_ACT_(\w+) = \d+", header)
    listed = re.findall(r"X\((\w+)\)", re.search(r"#define CYGEMM_ACTIVATIONS\(X\)([^\n]*)", header).group(1))
    assert listed == [a for a in enum if a != "NONE"], (listed, enum)
    kernels = open(os.path.join(PACKAGE, "kernels", "elementwise.cu")).read()
    assert kernels.count("CYGEMM_ACTIVATIONS(") == 2
    assert not re.search(r"case CYGEMM_ACT_\w+: args\(", kernels)
