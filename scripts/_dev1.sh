set -x
export CYGEMM_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
(python3 setup.py build_ext --inplace -j 16 && python3 -m pip install -q --no-build-isolation --no-deps -e .) > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
python3 -m pytest -q -p no:cacheprovider tests/test_ktail.py tests/test_determinism.py -k "bucket or capture or forced or checks_themselves or sweep_every_other" 2>&1 | tee $OUT/tests.log | grep -vE '^[.sF]+ *(\[ *[0-9]+%\])?$' | tail -30 | cut -c1-500
timeout 200 python3 -m benchmarks.batch_invariant_cost --out $OUT/bi_cost.json 2>&1 | tee $OUT/bi_cost.log | cut -c1-200
