"""On-device measurement: the local RPC fleet, the fast builder, and runner construction."""
