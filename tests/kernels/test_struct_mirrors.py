"""The C structs the kernel tests pass through ctypes, held against the headers: each mirror's size
and every field's offset equal what the C compiler lays out for the header's struct (offsetof and
sizeof, compiled by the emulator's build). CPU."""
import ctypes

import pytest

import emulator
import small_batched_emulated as small_batched
import test_backend_kernel as backend
import test_grouped_kernel as grouped

MIRRORS = [  # (header, C type, ctypes mirror)
    ("small_batched_kernels.h", "cygemm_small_batched_args", small_batched.Args),
    ("small_batched_kernels.h", "cygemm_small_batched_shape", small_batched.Shape),
    ("grouped_kernels.h", "cygemm_grouped_operand", grouped.Operand),
    ("grouped_kernels.h", "cygemm_grouped_problem", grouped.Problem),
    ("backend_kernels.h", "cygemm_strided_layout", backend.Layout),
]


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    lines = ["#include <stddef.h>"] + [f'#include "cygemm/{h}"' for h in sorted({m[0] for m in MIRRORS})]
    lines.append('extern "C" long long layout_of(int which, int field) {')
    for i, (_, ctype, mirror) in enumerate(MIRRORS):
        lines.append(f"    if (which == {i}) {{")
        lines.append(f"        if (field < 0) return (long long)sizeof({ctype});")
        for j, (name, *_rest) in enumerate(mirror._fields_):
            lines.append(f"        if (field == {j}) return (long long)offsetof({ctype}, {name});")
        lines.append("    }")
    lines += ["    return -1;", "}"]
    lib = emulator.build_or_skip("struct_mirrors", tmp_path_factory, source="\n".join(lines))
    lib.layout_of.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.layout_of.restype = ctypes.c_longlong
    return lib


@pytest.mark.parametrize("which", range(len(MIRRORS)), ids=[m[1] for m in MIRRORS])
def test_the_mirror_lays_out_as_the_header(layout, which):
    _, ctype, mirror = MIRRORS[which]
    assert layout.layout_of(which, -1) == ctypes.sizeof(mirror), ctype
    for j, (name, *_rest) in enumerate(mirror._fields_):
        assert layout.layout_of(which, j) == getattr(mirror, name).offset, f"{ctype}.{name}"
