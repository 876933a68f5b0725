"""The control plane: one detached actor that owns every resource, and the services it composes.

Agents, runs, groups, evaluations, messages, resolution, secrets, credits, tokens and the run
pool each live in a module here. The actor (`plane`) validates each change, writes it to
storage before it answers, recovers everything from storage when it starts, and creates the
runtime's actors. `client` is how every other process calls it.

May import: every engine package.
"""
