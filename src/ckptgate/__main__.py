"""``python -m ckptgate`` is the ``ckptgate`` command."""

from ckptgate._cli import main

main()
