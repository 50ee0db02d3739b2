"""The Python API: evalsup.run, read_results / to_pandas, and the exceptions they raise."""
