"""Pure decisions: group admission, evaluation arithmetic, secret redaction, JSON merge patch.

Everything here is a function of its arguments: no Ray, no storage or other I/O, no clock
(callers pass ``now``). That is what lets the group supervisor, the control plane and the
tests share one implementation and check it exhaustively.

May import: the ``nodus`` SDK's schemas and the standard library. Nothing else of ``nodus_ray``.
"""
