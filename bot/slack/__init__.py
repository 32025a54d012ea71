"""Everything that imports slack_sdk / slack_bolt: the Bolt app, its listeners, the outbox transport, the
runners (enforced by import-linter)."""
