"""Check what the sdist and the wheel hold, and that the wheel names no build-machine path.

    python check_dist.py SDIST WHEEL BUILD_DIR [BUILD_DIR ...]

What is needed comes from the source tree beside this script: its .pyx modules (compiled
modules, their stubs and the kernels their "# kernels:" lines name), every .pxd, .py and public header of cygemm/, every source
file of docs/. Fails (exit 1,
each problem on a line) if a needed file is missing, a generated or source-only
file is in the wheel, an extension's RUNPATH/RPATH has an entry outside $ORIGIN, or any file of
the wheel contains one of the BUILD_DIR paths or pip's temporary build folders.
"""
import glob
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def source_modules():
    """The compiled modules of the source tree ("nn._kernels" dotted: every .pyx under cygemm/,
    as setup.py builds them) and the kernel files each names on its "# kernels:" line."""
    found = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "cygemm", "**", "*.pyx"), recursive=True)):
        name = os.path.relpath(path, os.path.join(ROOT, "cygemm"))[:-4].replace(os.sep, ".")
        line = re.search(r"^# kernels: ([\w ]+)$", open(path).read(), re.M)
        found[name] = line.group(1).split() if line else []
    if not found:
        raise SystemExit("check_dist: no .pyx under cygemm/")
    return found


MODULES = source_modules()
PYX = [m.replace(".", "/") for m in MODULES]
KERNELS = sorted({k for ks in MODULES.values() for k in ks})
# Every .pxd of the source tree is part of the cimport contract the wheel ships.
PXD = sorted(os.path.relpath(p, os.path.join(ROOT, "cygemm"))[:-4]
             for p in glob.glob(os.path.join(ROOT, "cygemm", "**", "*.pxd"), recursive=True))
HEADERS = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "include", "cygemm", "*.h*")))
PY = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "cygemm", "**", "*.py"), recursive=True))
WHEEL_NEEDS = ([f"cygemm/{m}.pxd" for m in PXD] + [f"cygemm/{m}.pyi" for m in PYX] + [f"cygemm/{h}" for h in HEADERS]
               + PY + ["cygemm/py.typed", "cygemm/capi.pxd"])
SDIST_NEEDS = ([n for n in WHEEL_NEEDS if not n.startswith("cygemm/include/")] + HEADERS + [f"cygemm/{m}.pyx" for m in PYX] + [f"cygemm/kernels/{k}.cu" for k in KERNELS]
               + ["setup.py", "pyproject.toml", "README.md", "LICENSE",
                  "tests/conftest.py", "tests/fakes.py", "tests/gpu_util.py", "tests/refs/cublas.py",
                  "tests/contracts/test_cimport.py",
                  "examples/cython_consumer/consumer.pyx", "examples/cython_consumer/setup.py"])
# The docs are built from the sdist: every source file of docs/ (what Sphinx generates aside).
DOCS = sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "**", "*"), recursive=True)
              if os.path.isfile(p) and not os.path.relpath(p, ROOT).startswith(("docs/_build", "docs/_generated"))
              and "__pycache__" not in p)
SDIST_NEEDS += DOCS
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
        problems += [f"wheel lacks the compiled module cygemm.{m.replace('/', '.')}" for m in missing]
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
