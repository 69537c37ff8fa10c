"""gradtune."""
