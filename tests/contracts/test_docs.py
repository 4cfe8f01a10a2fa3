"""Every example in the documentation runs and prints what the page shows: the ``.. doctest::``
blocks of docs/*.rst, run as Sphinx's doctest builder would, page by page (those marked
``:skipif: no_gpu`` only where a GPU is usable)."""
import doctest
import glob
import os
import re

import pytest

DOCS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs")


def _examples(page):
    """(needs_gpu, text) of each doctest block of an .rst page."""
    lines = open(page).read().splitlines()
    out, i = [], 0
    while i < len(lines):
        if lines[i].strip() == ".. doctest::":
            i += 1
            options = []
            while i < len(lines) and lines[i].strip().startswith(":"):
                options.append(lines[i].strip())
                i += 1
            body = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith("   ")):
                body.append(lines[i][3:])
                i += 1
            out.append((":skipif: no_gpu" in options, "\n".join(body).strip() + "\n"))
        else:
            i += 1
    return out


PAGES = sorted(glob.glob(os.path.join(DOCS, "*.rst")))


def test_the_docs_have_examples_to_run():
    examples = [e for p in PAGES for e in _examples(p)]
    assert len(examples) >= 6 and any(not gpu for gpu, _ in examples)


def _run(page, gpu):
    ns = {}
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    for needs_gpu, text in _examples(page):
        if needs_gpu != gpu:
            continue
        test = doctest.DocTestParser().get_doctest(text, ns, os.path.basename(page), page, 0)
        runner.run(test, clear_globs=False)
        ns.update(test.globs)                   # a page's blocks share their names, as in Sphinx
    assert runner.failures == 0, f"{os.path.basename(page)}: {runner.failures} examples failed"


@pytest.mark.parametrize("page", [p for p in PAGES if any(not g for g, _ in _examples(p))],
                         ids=os.path.basename)
def test_examples_that_need_no_gpu(page):
    _run(page, gpu=False)


@pytest.mark.gpu
@pytest.mark.parametrize("page", [p for p in PAGES if any(g for g, _ in _examples(p))], ids=os.path.basename)
def test_examples_that_need_a_gpu(page):
    _run(page, gpu=True)
