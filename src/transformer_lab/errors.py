class TransformerLabError(Exception):
    """A problem with the user's input or set-up, reported as one line, never a traceback."""


class DataError(TransformerLabError):
    """Bad input data; the message names the file (and line) or field at fault."""
