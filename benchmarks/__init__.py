"""Side-by-side benchmarks of embstore against the tools users would otherwise use.

Run ``python benchmarks/run.py [--quick] [--only NAME]``; see ``run.py``.
"""
