"""The agent runtime: what runs a durable Python program's entrypoint with a `RunContext`.

Private. `protocol` is the wire between the program (inside its sandbox) and its run actor;
the rest is the program's side of it (`bootstrap`, started in the sandbox) and `Agent.local`'s
in-memory journal. Nothing here imports Ray.
"""
