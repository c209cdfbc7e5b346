"""The one error of the tokenizer package."""


class TokenizerError(Exception):
    """A tokenizer cannot be built, trained or loaded (a one-line reason)."""
