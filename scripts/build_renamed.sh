#!/usr/bin/env bash
# Build another commit of cygemm beside this one, as the package `cygemm_old` (or NAME), so
# that one process can import both and time them interleaved on the same operands:
#   bash scripts/build_renamed.sh COMMIT DIR [NAME]  # then: PYTHONPATH=DIR python3 -m benchmarks.compare_builds
# (this tree built again as `cygemm_same` gives compare_builds its A/A row: what the method
# alone reads as a difference.)
# Every name of the package (modules, cimports, the header folder, the kernels' C symbols) is
# renamed, so the two builds share nothing but cuBLAS.
set -euo pipefail
COMMIT=$1
DIR=$(mkdir -p "$2" && cd "$2" && pwd)
NAME=${3:-cygemm_old}
cd "$(dirname "$0")/.."
rm -rf "$DIR/src" && mkdir -p "$DIR/src"
# COMMIT: a commit of this repository, or a tar of its cygemm/ and setup.py (`git archive -o
# old.tar COMMIT cygemm setup.py [include]`) where the machine has no .git.
if [ -f "$COMMIT" ]; then tar -xf "$COMMIT" -C "$DIR/src"; else git archive "$COMMIT" cygemm setup.py $(git ls-tree --name-only "$COMMIT" include) | tar -x -C "$DIR/src"; fi
cd "$DIR/src"
mv cygemm "$NAME"
# The kernels' headers: include/cygemm at the top of the tree, or inside the package in older commits.
HEADERS=$(find . -type d -path '*include/cygemm' | head -1)
mv "$HEADERS" "$(dirname "$HEADERS")/$NAME"
grep -rlE "cygemm" --include='*.py' --include='*.pyx' --include='*.pxd' --include='*.cu' --include='*.cuh' --include='*.h' . \
    | xargs sed -i -E "s/\\bcygemm\\b/$NAME/g; s/\\bcygemm_(act|bias|hold|mlp)/${NAME}_\\1/g; s/\\bCYGEMM_(ACT|KERNELS_H|TIMING_H)/${NAME^^}_\\1/g"
python3 setup.py build_ext --inplace -j "$(nproc)" > "$DIR/build.log" 2>&1 || { tail -30 "$DIR/build.log"; exit 1; }
rm -rf "${DIR:?}/$NAME" && mv "$NAME" "$DIR/$NAME"
echo "built $COMMIT as $NAME in $DIR"
