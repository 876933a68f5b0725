"""A second module of the source: a directory source uploads every file in it."""


def shout(word: str) -> str:
    return word.upper() + "!"
