"""Records -> the report (HTML / JSON / Markdown), the upgrade diff, templates."""
