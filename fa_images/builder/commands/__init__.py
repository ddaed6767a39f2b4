"""The builder's commands, one module each (its parser, examples and action); ``cli.py`` holds the
table of them and turns every error into its exit code."""
