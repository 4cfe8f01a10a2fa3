export CYGEMM_CUDA_ARCHS=90 PYTHONUNBUFFERED=1
(python3 setup.py build_ext --inplace -j 16 && python3 -m pip install -q --no-build-isolation --no-deps -e .) > $OUT/build.log 2>&1 || { tail -30 $OUT/build.log; exit 1; }
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_ktail.py tests/test_streams_devices.py -k "capture or forced or checks_themselves or not ktail" 2>&1 | tail -4
