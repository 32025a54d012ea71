"""Orchestration: the services handlers call (hosts, launches, confirmations, stack dumps, the watch), and
the only users of the store; the audit writer, the outbox and the Surface where answers go."""
