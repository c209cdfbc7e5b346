"""The reference pages of the documentation, one module each, rendered from the code.

scripts/docs_reference.py writes them (`make docs-reference`); markdown.py holds what they share.
"""
