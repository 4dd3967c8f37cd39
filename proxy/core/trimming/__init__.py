"""Trimming: the budget, the turns and what is pinned, the strategies that cut, and the notes and
summaries put in."""
