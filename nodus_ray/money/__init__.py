"""What things cost and who may spend: prices, billing rules, a run's spend, project credits.

Amounts are exact decimals. A cap is checked against the worst case before a call is made,
so no cap is ever exceeded.

May import: ``models.base`` (usage), ``store``. No Ray.
"""
