# matmul's batch layout has no Python API: cygemm.matmul cimports it.
