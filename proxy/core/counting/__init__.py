"""Counting: what a whole body costs, cached and carried, exact or bounded, and the provider's own
count at the budget's edge."""
