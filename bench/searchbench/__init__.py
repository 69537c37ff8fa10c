"""The search-efficiency benchmark's parts (the protocol is in bench/search_efficiency.py)."""
