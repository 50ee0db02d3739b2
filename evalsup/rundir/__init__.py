"""The run directory on disk: its layout, lock, checkpoint, journal (results.jsonl and its writer), run.json, the input
copy, and the crash-safe rewrite.
"""
