"""The adversarial corpus's table of classes and counts is printed by ``tests/conftest.py``
(``pytest_terminal_summary``), from the ``adv_tally`` property each case's report carries: the
process that prints the summary receives every report, with pytest-xdist too."""
