"""Bytes at a URL: the fsspec Store (retries, atomic writes, redaction), the disk cache, the prefetcher."""
