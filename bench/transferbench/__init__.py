"""The transfer-tuning benchmark's parts (the protocol is in bench/transfer_tuning.py)."""
