"""The pure core: models, shell quoting, redaction, the grammar, the probe script and its assembly, parsers,
launch/kill rules, one check as data, stack dumps and the diagnosis. No I/O library is imported here
(enforced by import-linter)."""
