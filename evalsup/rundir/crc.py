"""The CRC-32 the checkpoint keeps of ``results.jsonl[:L]`` (``results_crc``): ISA-L's (the ``isal`` package)
when it is installed, else zlib's. The same polynomial, so the same values: a run directory checked by one is
checked by the other. ISA-L's uses the CPU's carry-less multiply: 10.3 GB/s against zlib 1.2.13's 1.85 GB/s over
1 MiB lines here, which at 1 MB results was most of the journal writer's user CPU (docs/benchmarks.md, issue 40).
"""

from __future__ import annotations

try:
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal is a dependency; zlib's is the same function, slower
    from zlib import crc32

__all__ = ["crc32"]
