"""Local stand-ins for the services nodus-ray talks to, so tests need no network and no keys."""
