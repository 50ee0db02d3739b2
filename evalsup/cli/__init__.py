"""The command line: click commands that parse, build the config and call in."""
