"""Webhooks: what a Webhook is sent (events), how it is signed, where it may go, and the one
HTTP request that delivers it, with each attempt recorded.

The control plane's `control.webhook_service` decides when (a run's or group's change, the
retry timers) and is the one writer of the records; the modules here hold no state of their
own. They may import the SDK's schemas, `store` (the records), `egress_policy` (which
addresses are public) and `egress.resolve` (the one lookup of a host's addresses); never Ray, the sandbox or the models.
"""
