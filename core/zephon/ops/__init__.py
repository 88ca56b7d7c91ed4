"""Pipeline operators: one module per transformation.

Each operator has a frozen *spec* (what the user asked for, validated at once and part of the
pipeline fingerprint) and, where it keeps data between records, a runtime stage with explicit
``snapshot()``/``restore()`` used for exact resume.
"""
