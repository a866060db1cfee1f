"""tracekit's pytest plugin: GPU memory budgets per test (``docs/pytest.md``).

``plugin`` holds the pytest hooks and imports nothing heavy; ``cupy_meter`` and ``torch_meter``
measure one test (loaded with the first measured test); ``verdict`` writes a test's trace and
turns a peak over its budget into the failure message (with the call-sites and advise's setting).
"""
