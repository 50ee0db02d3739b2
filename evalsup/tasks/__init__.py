"""A task line and its record: reading and validating the task file, ids, fingerprints, turning a line into a request
and a result into a record. Pure; both sides import it.
"""
