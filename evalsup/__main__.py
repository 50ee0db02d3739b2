"""``python -m evalsup`` is the ``evalsup`` command."""

from evalsup.cli import main

main()
