"""The checkpoint's CRC-32 of results[:L] (rundir/crc.py) is zlib's value whichever implementation computes it:
a run directory checkpointed by one is checked by the other (issue 40: ISA-L's, ~5x faster, when installed)."""

from __future__ import annotations

import random
import zlib

from evalsup.rundir.crc import crc32


def test_the_crc_is_zlibs_line_by_line_and_at_once() -> None:
    rnd = random.Random(40)
    lines = [rnd.randbytes(rnd.choice([1, 100, 4096, 1 << 20])) + b"\n" for _ in range(40)]
    ours = theirs = 0
    for line in lines:
        ours = crc32(memoryview(line), ours)  # the writer passes views (of a ring, of a pipe buffer)
        theirs = zlib.crc32(line, theirs)
        assert ours == theirs
    assert crc32(b"".join(lines)) == theirs  # a resume checks the covered prefix in one read
