"""Use cases: compose store operations, authorization and audit in one transaction."""
