export CYGEMM_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
(python3 setup.py build_ext --inplace -j 16 && python3 -m pip install -q --no-build-isolation --no-deps -e .) > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
CYGEMM_KTAIL_REPORT=$OUT/ktail_sweep.jsonl timeout 530 python3 -m pytest -q -rf -p no:cacheprovider --durations=15 tests > $OUT/tests.log 2>&1
echo rc=$?
grep -vE '^[.sFx]+ *(\[ *[0-9]+%\])?$' $OUT/tests.log | grep -E "FAILED|ERROR|passed|failed|^[0-9.]+s " | tail -45 | cut -c1-300
gzip -k $OUT/tests.log
