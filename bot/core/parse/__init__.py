"""Pure parsers of what hosts print (ps, nvidia-smi, /proc/net/tcp, logs, curl); they never raise."""
