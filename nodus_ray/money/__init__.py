"""What things cost and who may spend: prices, billing rules, a run's spend, project credits.

Amounts are exact decimals. A cap is checked against the worst case before a call is made,
so no cap is ever exceeded.

May import: ``models.base`` (usage) and ``models.catalog`` (which model a family is), ``store``.
No Ray, and no provider (providers and prices share ``models.catalog`` and import neither
other).
"""
