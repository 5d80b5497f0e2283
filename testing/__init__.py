"""The harness that tests and benches share (as Beam's ``apache_beam/testing``): free ports, the counting and
fault-injecting HTTP proxy, the S3 and GCS emulators, Beam's engines on loopback, and small snapshot writers.

It imports neither ``tests`` nor ``bench``, and they never import each other but through it (the benches' own
tests in ``tests/bench`` aside): ``tests/testing/test_harness_imports.py`` checks it. Not part of the
distribution; it runs from the clone, as ``tests`` and ``bench`` do.
"""
