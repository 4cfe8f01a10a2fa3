# The calls whose group offsets are a device array (see device_offsets.pyx): which route runs
# them, and running it.
from cygemm.engine.types cimport MatrixView
from cygemm.engine.args cimport CallArgs
from cygemm.grouped.lt_grouped cimport LtGroupedCall

# Whether group offsets are a device array (CuPy, torch CUDA, __cuda_array_interface__, DLPack
# on CUDA); else they are host ints.
cdef bint on_device(object offsets) except -1
# ValueError unless route is None, a name of host_names or of DEVICE_OFFSET_ROUTES.
cdef int check_route(object route, tuple host_names) except -1
# ValueError unless the offsets' view is contiguous and aligned to its elements (the kernel reads them).
cdef int check_offsets_view(const MatrixView* ov) except -1
# The offsets as host ints, once the stream's work before them is done (one sync).
cdef list offsets_to_host(object stream_ptr, const MatrixView* ov)
# Run a call whose arguments c holds (prepared: prepare_call done), its offsets at
# c.views[offsets_at], its grouped-matmul problem lt (why_layout: why its layout rules that route
# out, or None): the chooser's route between "lt_grouped" and "host_offsets". host_run(offsets,
# route) runs the host route for host ints (route: a name of ROUTES asked for, or None).
# promise: the first-use check lt_grouped rests on ("lt_grouped", "lt_grouped_fp8").
cdef int run_on_device(CallArgs* c, int offsets_at, LtGroupedCall* lt, object why_layout, object host_run,
                       object route, object autotune, object determinism, bint check_offsets,
                       tuple host_names, str what, str promise=*) except -1
# describe_moe's keys for a device-offset call (no GPU needed).
cdef dict describe_on_device(LtGroupedCall* lt, object why_layout, object autotune, object determinism,
                             bint capturing, str promise=*)
