"""The control plane: one detached actor that owns every resource, and the services it composes.

The actor (`plane`) is a thin facade, the way Ray Serve's controller is built: it composes the
services (`services.compose`), recovers once before it serves a call (`recovery`), and hands
each call to one service. The services share the resources through `registry.Registry` and
start Ray actors only through launchers (`run_launcher.RayRunActors`,
`group_actors`), so each is unit-tested without Ray:

* `agents` (Agents and revisions), `runs` (AgentRuns and run actors' reports),
  `run_supervisor` (one actor per unfinished run, replacement, deadlines, cancel and delete);
* `groups` (AgentGroups), `group_link` (asking, telling and obeying a group's supervisor),
  `evaluations` and `evaluation_plan` (evaluation groups' cases and grading);
* `messages` and `inbox` (keep-alive runs), `resolution` (uncertain steps);
* `secret_service` over `secrets` (sealed Secrets), `credits` (balances), `access` over
  `tokens` (the API's tokens), `run_pool` (pre-started run actors), `batches` (all-or-none
  lists of runs).

`client` is how every other process calls it. May import: every engine package.
"""
