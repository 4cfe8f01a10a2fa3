"""Importing this puts the repository's examples/ folder on sys.path (tests import the
examples' model code to test it as users run it)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
