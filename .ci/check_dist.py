"""Check what the sdist and the wheel hold, and that the wheel names no build-machine path.

    python check_dist.py SDIST WHEEL BUILD_DIR [BUILD_DIR ...]

Fails (exit 1, each problem on a line) if a needed file is missing, a generated or source-only
file is in the wheel, an extension's RUNPATH/RPATH has an entry outside $ORIGIN, or any file of
the wheel contains one of the BUILD_DIR paths or pip's temporary build folders.
"""
import subprocess
import sys
import tarfile
import tempfile
import zipfile

PYX = ["_errors", "_settings", "_streams", "_release", "_context", "_arrays", "_alloc", "_args", "_timing",
       "tuning", "_launch", "_candidates", "plans", "routes", "rowmajor", "gemm_plan", "_batch_layout", "matmul",
       "epilogues", "_dense_routes", "dense", "fp8", "elementwise", "_groups", "grouped", "graph"]
PXD = ["bindings/cublas", "bindings/cublaslt", "bindings/cudart", "kernels/elementwise", "kernels/timing",
       "kernels/fp8", "kernels/grouped", "_types", "_errors", "_settings", "_streams",
       "_release", "_context", "_arrays", "_alloc", "_args", "_timing", "tuning", "_launch", "_candidates", "plans",
       "routes", "rowmajor", "_batch_layout", "epilogues", "_dense_routes", "fp8", "_groups"]
STUBS = PYX
WHEEL_NEEDS = ([f"cygemm/{m}.pxd" for m in PXD] + [f"cygemm/{m}.pyi" for m in STUBS]
               + ["cygemm/__init__.py", "cygemm/_cuda_paths.py", "cygemm/gemm_ops.py", "cygemm/fused.py", "cygemm/py.typed",
                  "cygemm/include/cygemm/kernels.h", "cygemm/include/cygemm/fp8_kernels.h",
                  "cygemm/include/cygemm/grouped_kernels.h"]
               + [f"cygemm/nn/{m}.py" for m in ("__init__", "_kernels", "layers", "losses", "optimizers", "step")]
               + [f"cygemm/backend/{m}.py" for m in ("__init__", "protocol", "_base", "_convert", "_kernels",
                                                     "numpy_backend", "cuda_backend")])
SDIST_NEEDS = (WHEEL_NEEDS + [f"cygemm/{m}.pyx" for m in PYX]
               + ["cygemm/kernels/elementwise.cu", "cygemm/kernels/fp8.cu", "cygemm/kernels/grouped.cu",
                  "cygemm/kernels/timing.cu", "setup.py", "pyproject.toml", "README.md", "LICENSE",
                  "tests/conftest.py", "tests/fakes.py", "tests/gpu_util.py", "tests/test_cimport.py",
                  "examples/cython_consumer/consumer.pyx", "examples/cython_consumer/setup.py"])
GENERATED = (".c", ".cpp", ".o", ".so")
NOT_IN_WHEEL = (".c", ".cpp", ".o", ".pyx", ".cu")


def main(sdist, wheel, *build_dirs):
    problems = []
    with tarfile.open(sdist) as tar:
        names = [n.split("/", 1)[1] for n in tar.getnames() if "/" in n]
    problems += [f"sdist lacks {n}" for n in SDIST_NEEDS if n not in names]
    problems += [f"sdist holds generated {n}" for n in names if n.endswith(GENERATED)]

    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        problems += [f"wheel lacks {n}" for n in WHEEL_NEEDS if n not in names]
        problems += [f"wheel holds {n}" for n in names if n.endswith(NOT_IN_WHEEL)]
        sos = [n for n in names if n.endswith(".so")]
        missing = [m for m in PYX if not any(s.startswith(f"cygemm/{m}.") for s in sos)]
        problems += [f"wheel lacks the compiled module cygemm.{m}" for m in missing]
        needles = [d.encode() for d in build_dirs] + [b"pip-build-env-", b"pip-req-build-", b"pip-wheel-"]
        with tempfile.TemporaryDirectory() as tmp:
            for n in names:
                data = zf.read(n)
                problems += [f"wheel file {n} contains the build path {x.decode()!r}" for x in needles if x in data]
                if n.endswith(".so"):
                    path = zf.extract(n, tmp)
                    dyn = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
                    for line in dyn.splitlines():
                        if "RPATH" in line or "RUNPATH" in line:
                            entries = line.split("[", 1)[1].rstrip("]").split(":")
                            bad = [e for e in entries if not e.startswith("$ORIGIN")]
                            problems += [f"{n}: RUNPATH/RPATH entry {e!r} outside $ORIGIN" for e in bad]
                            print(f"{n}: {line.split('(', 1)[1].split(')')[0]} {entries}")
    for p in problems:
        print("PROBLEM:", p)
    print(f"check_dist: {len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
