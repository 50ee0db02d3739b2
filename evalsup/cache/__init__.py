"""The answer cache across runs (issue 30 item 3): a key per canonical request (``key``), what may be kept
(``keep``), the SQLite file (``store``), the file system it may live on (``mounts``), the worker's reads
(``lookup``) and the supervisor's writes after the results are committed (``feed``)."""
