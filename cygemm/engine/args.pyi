# The one argument path has no Python API: entry points cimport it (see args.pxd).
