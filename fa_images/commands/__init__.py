"""The commands of the ``fa-images`` command line, one module each: its parser, its examples and
its action (``add(sub)`` registers it). ``cli.py`` holds the table of them."""
