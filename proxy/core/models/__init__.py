"""Models: profiles and windows, families and their framing, and which model names may go into a URL."""
