"""Presentation, pure apart from rendering: views (snapshots -> template contexts), the Renderer (Jinja2 ->
Block Kit + text), button action ids, the timeline chart."""
