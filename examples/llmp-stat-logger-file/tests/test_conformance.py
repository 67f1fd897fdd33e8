"""The conformance kit's checks for this plugin's kind.

`llmp plugins verify NAME` runs the same checks against the installed plugin.
"""

from llmp.conformance import assert_conforms


def test_stat_logger_file_conforms():
    assert_conforms("stat-logger-file")
