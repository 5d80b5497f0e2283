"""Bundled example data, preprocessing functions and the `make demo` script."""
