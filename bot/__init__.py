"""gpubot: a Slack chat-ops bot for debugging GPU inference servers as a team (see docs/development.md, Layout)."""
