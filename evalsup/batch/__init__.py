"""The provider's Batch API (issue 31): the planner (``plan``), the provider client (``client``), the intent
journal (``journal``), the records of batch answers (``records``) and the driver process (``driver``), which the
supervisor starts in its workers' place for a ``--batch-api`` run."""
