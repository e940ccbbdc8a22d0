"""The ``xstage`` command line: thin modules over the library; only this package prints or exits."""
