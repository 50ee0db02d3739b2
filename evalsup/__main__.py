"""``python -m evalsup`` is the ``evalsup`` command."""

from evalsup.cli.main import main

main()
