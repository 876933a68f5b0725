"""The ``nodus`` command line: kubectl-style verbs over the nodus API."""
