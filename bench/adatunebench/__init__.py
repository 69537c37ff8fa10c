"""The AdaTune ablation's parts (the protocol is in bench/adatune_ablation.py)."""
