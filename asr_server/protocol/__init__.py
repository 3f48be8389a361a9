"""Wire format: pipeline events to JSON messages, client JSON to commands."""
