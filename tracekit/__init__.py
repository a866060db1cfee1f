"""tracekit: record, replay and explain GPU out-of-memory errors.

The package is laid out by pipeline stage: ``trace`` (the v1 Parquet format),
``record`` and ``importers`` (producing traces), ``sim`` and ``device``
(replaying them), ``analysis`` (fragmentation, OOM diagnosis, what-if),
``budget`` (device memory before the first allocation), ``report`` (plots)
and ``cli`` (one module per verb).
"""

__version__ = "0.1.0"
