"""Seeded faults in our kernel files, each of which the CPU kernel tests must catch: proof that
they bite. Each fault replaces one exact text of a kernel file; the runner applies one at a time,
runs that file's tests on the emulator, expects them to fail, and puts the file back.

    python tests/kernels/emulator/faults.py [kernel ...]

Prints one line per fault (caught: how many tests failed; MISSED where none did) and exits 1 when
a fault was missed, unless the list says why no CPU test can catch it (a known miss). It edits cygemm/kernels/<name>.cu in place for the length of one test run (the
emulator builds the file from the tree), restoring it whatever happens.
"""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))

# kernel -> (its tests, [(what the fault is, the text, the text with the fault[, why no CPU test can catch it])])
FAULTS = {
    "elementwise": ("tests/kernels/test_elementwise_kernel.py", [
        ("leaky_relu ignores its slope",
         "case CYGEMM_ACT_LEAKY_RELU: return z > 0.f ? z : slope * z;",
         "case CYGEMM_ACT_LEAKY_RELU: return z > 0.f ? z : 0.01f * z;"),
        ("the bias gradient's column sum skips the block's first row of partial sums",
         "for (int r = 0; r < kRowThreads; ++r) s += sums[r][c];",
         "for (int r = 1; r < kRowThreads; ++r) s += sums[r][c];"),
        ("the barrier before the column sum is dropped",
         "    __syncthreads();\n    // Fixed-order sum over the block's rows",
         "    // Fixed-order sum over the block's rows"),
        ("the forward's z is never stored",
         "if (z) storev<T, VEC>",
         "if (z && false) storev<T, VEC>"),
    ]),
    "fp8": ("tests/kernels/test_fp8_kernel.py", [
        ("the first warp reduction of the amax stops a lane short",
         "    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));\n"
         "    if ((threadIdx.x & 31) == 0)",
         "    for (int off = 16; off > 1; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));\n"
         "    if ((threadIdx.x & 31) == 0)"),
        ("the vector path does not saturate",
         "__NV_SATFINITE, fmt);\n                reinterpret_cast<uint4*>(q)[c] = out;",
         "__NV_NOSAT, fmt);\n                reinterpret_cast<uint4*>(q)[c] = out;"),
        ("the block's amax leaves out its last warp",
         "m = threadIdx.x < kThreads / 32 ? warp_max[threadIdx.x] : 0.f;",
         "m = threadIdx.x < kThreads / 32 - 1 ? warp_max[threadIdx.x] : 0.f;"),
    ]),
    "fp8_scales": ("tests/kernels/test_fp8_scales_kernel.py", [
        ("a lane group's maximum stops a lane short",
         "for (int off = LANES / 2; off > 0; off >>= 1)",
         "for (int off = LANES / 2; off > 1; off >>= 1)"),
        ("the block's maximum leaves out its first warp",
         "    m = warp_m[0];\n    for (int w = 1;",
         "    m = 0.f;\n    for (int w = 1;"),
        ("the barrier after the block's maximum is dropped (warp_m reused at once)",
         "    __syncthreads();                   // (warp_m is reused by the next call)",
         "                                       // (warp_m is reused by the next call)"),
        ("a power-of-two scale rounds up instead of down",
         "if (pow2) m = ldexpf(1.f, ilogbf(m));",
         "if (pow2) m = ldexpf(1.f, ilogbf(m) + 1);"),
    ]),
    "backend": ("tests/kernels/test_backend_kernel.py", [
        ("a row's last column is not written",
         "for (int j = lane; j < cols; j += 32) yr[j] =",
         "for (int j = lane; j < cols - 1; j += 32) yr[j] ="),
        ("the sigmoid's positive branch has the wrong sign",
         "if (x >= 0) return 1 / (1 + exp(-x));",
         "if (x >= 0) return 1 / (1 + exp(x));"),
        ("the strided layout's first dimension is ignored",
         "for (int d = layout.ndim - 1; d >= 0; --d)",
         "for (int d = layout.ndim - 1; d > 0; --d)"),
    ]),
    "small_batched": ("tests/kernels/test_small_batched_kernel.py", [
        ("the padded path's barrier after a run's compute is dropped (the next run is staged over it)",
         "            else compute<T, RM, RN, SIZE, VEC, LAYOUT>(p, sa, sb, first, count);\n            __syncthreads();\n",
         "            else compute<T, RM, RN, SIZE, VEC, LAYOUT>(p, sa, sb, first, count);\n"),
        ("the two-stage path computes before its run's copies have landed",
         "            wait_copies<1>();\n            __syncthreads();",
         "            wait_copies<2>();\n            __syncthreads();"),
        ("the last, partial run takes a full run of matrices",
         "            const int count = int(p.batch - first < p.mpb ? p.batch - first : p.mpb);\n"
         "            if (!p.oa.broadcast) stage",
         "            const int count = int(p.mpb);\n"
         "            if (!p.oa.broadcast) stage",
         "known miss: it only reads past A and B (the compute bounds its writes by the batch), and the "
         "emulator does not check reads against the arrays' bounds; compute-sanitizer on a GPU does"),
    ]),
    "grouped": ("tests/kernels/test_grouped_kernel.py", [
        ("an empty expert's weight gradient keeps its M and N (K = 0 then means beta C, not zero)",
         "if (p.ragged == CYGEMM_RAGGED_K && rows == 0) m = n = 0;",
         "if (false) m = n = 0;"),
        ("the table's C pointers are left unwritten",
         "reinterpret_cast<void**>(table + t.c)[g] = d;",
         "(void)0;"),
    ]),
    "nn": ("tests/kernels/test_nn_kernel.py", [
        ("the block that adds the partial sums is not the last to finish",
         "last = (prev == gridDim.x - 1);",
         "last = (prev == 0);"),
        ("SGD's first step starts the momentum buffer from the dampened gradient",
         "float b = t == 1 ? d : momentum * buf[i] + (1.f - dampening) * d;",
         "float b = momentum * buf[i] + (1.f - dampening) * d;"),
        ("the block sum adds every warp's slot, also those no warp of a smaller block wrote",
         "for (int w = 0; w < (blockDim.x + 31) / 32; ++w) t += warp_sums[w];",
         "for (int w = 0; w < 32; ++w) t += warp_sums[w];"),
        ("Adam's second moment is not bias-corrected",
         "bc2_sqrt = sqrtf(1.f - powf(beta2, (float)t));",
         "bc2_sqrt = 1.f;"),
    ]),
}


def run(kernels):
    missed = []
    for name in kernels:
        tests, faults = FAULTS[name]
        path = os.path.join(ROOT, "cygemm", "kernels", f"{name}.cu")
        original = open(path).read()
        for what, text, fault, *known in faults:
            if original.count(text) != 1:
                print(f"{name}: {what}: the text to replace is not in the file once (update the list)")
                missed.append((name, what))
                continue
            try:
                with open(path, "w") as f:
                    f.write(original.replace(text, fault))
                done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", tests],
                                      cwd=ROOT, capture_output=True, text=True)
            finally:
                with open(path, "w") as f:
                    f.write(original)
            summary = (done.stdout.strip().splitlines() or ["?"])[-1]
            caught = done.returncode != 0 and "failed" in summary
            if not caught and known:
                print(f"{name}: {what}: missed, as listed ({known[0]})")
                continue
            print(f"{name}: {what}: {'caught (' + summary + ')' if caught else 'MISSED'}")
            if not caught:
                missed.append((name, what))
    return missed


if __name__ == "__main__":
    sys.exit(1 if run(sys.argv[1:] or list(FAULTS)) else 0)
