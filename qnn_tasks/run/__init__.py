"""One stage call end to end: the call, the funnel, records, the shared cache, executors, console."""
