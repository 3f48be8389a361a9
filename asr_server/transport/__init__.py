"""Thin I/O shells: read, feed the session core, drain its events, write."""
