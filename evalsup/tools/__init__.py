"""Commands over run directories, offline: status, report, merge with its coverage proof, rescore."""
