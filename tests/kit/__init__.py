"""What tests share: builders, corpora, token helpers, servers' clients and the resume check.

Tests import from here, never from one another (``tests/test_import_rules.py`` holds that), so a
test module can be moved, renamed or deleted without breaking another.
"""
