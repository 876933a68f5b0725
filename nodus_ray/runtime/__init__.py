"""What runs inside Ray besides the control plane: run actors, group supervisors, the grader, the router.

A run actor owns one run's sandbox, journal and conversation loop (`conversation`); a group
supervisor owns one group's admission and cost reservations; the grader grades an
evaluation's answers apart from every run; the router picks a model family per turn.

May import: every engine package except ``control`` (actors reach the control plane through
``control.client`` only).
"""
