"""Scorers (built-in and user-loaded) and their statistics. Pure; both sides import it."""
