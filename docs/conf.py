"""Sphinx configuration of cygemm's documentation (built with warnings as errors in CI)."""
project = "cygemm"
copyright = "2026, the cygemm authors"
import cygemm  # noqa: E402  (the API reference documents the cygemm that is installed)

release = version = cygemm.__version__

# The cimport contract as the installed cygemm ships it (docs/cython.rst shows it): copied here,
# because the docs may be built beside a source tree whose package is not the installed one.
import os as _os  # noqa: E402
import shutil as _shutil  # noqa: E402
_generated = _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "_generated")
_os.makedirs(_generated, exist_ok=True)
_shutil.copyfile(_os.path.join(_os.path.dirname(cygemm.__file__), "capi.pxd"), _os.path.join(_generated, "capi.pxd"))

extensions = ["sphinx.ext.autodoc", "sphinx.ext.autosummary", "sphinx.ext.doctest", "numpydoc"]
# cygemm.autograd subclasses torch's classes; where torch is not installed (the docs extra does
# not need it) autodoc reads it against a stand-in.
# Likewise cygemm.jax where JAX is not installed.
autodoc_mock_imports = []
for _name in ("torch", "jax"):
    try:
        __import__(_name)
    except ImportError:
        autodoc_mock_imports.append(_name)
autosummary_generate = False
# No "members" default here: it would override each entry's explicit ``:members:`` list in
# api.rst (tests/contracts/test_api_reference.py checks that list against the package).
autodoc_default_options = {}
numpydoc_show_class_members = False
numpydoc_validation_checks = set()
# Every cross-reference must resolve: with -W (CI) a dead link fails the build.
nitpicky = True
# Types the signatures of nn and backend name that have no page here (NumPy's own is not linked;
# the stream protocol is documented with StreamLike in the stubs).
nitpick_ignore = [("py:class", "numpy.random._generator.Generator"),
                  ("py:class", "cygemm.typing.CudaStreamProtocol")]
html_theme = "pydata_sphinx_theme"
html_title = f"cygemm {release}"
html_theme_options = {"navigation_depth": 2, "show_toc_level": 2}
# The pages are one level deep: a left "Section Navigation" box would be empty on all but the
# performance page and its one child, the full results.
html_sidebars = {"**": [], "performance": ["sidebar-nav-bs"], "results": ["sidebar-nav-bs"]}
exclude_patterns = ["_build"]

# Examples run by `sphinx-build -b doctest`: those that need a GPU skip where none is usable
# (CI); the GPU suite runs them all.
doctest_global_setup = """
import cygemm
no_gpu = cygemm.gpu_unavailable_reason() is not None
"""
