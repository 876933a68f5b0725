"""Durable state: the storage filesystem, the key layout, timestamps, and sealing at rest.

`storage.Storage` is the only durable state of the service (a ``pyarrow.fs`` URI). Every
storage key is built by `layout`, so the shape of storage can be read in one module.

May import: ``core`` and the standard library, ``pyarrow`` and ``cryptography``. No Ray.
"""
