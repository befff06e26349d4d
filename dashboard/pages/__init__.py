"""One module per page: `PATH`, `TITLE` and `layout(loaded, runs)`; pages with interactions
also have `register(app, runs)` for their callbacks."""
