"""The serving process: the app, start, reload, drain and stop, and the workers."""
