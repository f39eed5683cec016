"""The benchmarks (docs/benchmarks.md).

A regular package, so that every module here has one name, ``bench.<path>``,
whether a script is run by its path (``python bench/mesh/run.py``) or as a
module (``python -m bench.mgmt_api.bench``): the scripts import each other by
that name, and mypy checks them under it. A script run by its path puts the
repository root first on ``sys.path`` before it imports ``bench.…``; for those
in bench/extauthz that also keeps their own directory, which holds a
``bench.py``, from shadowing this package.
"""
