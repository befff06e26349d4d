"""The Dash app shell: navigation, the run selector and a router over the pages.

    diag dashboard RUN [RUN ...] [--host 127.0.0.1] [--port 8050] [--live]

The runs are loaded, measured and diagnosed once, at start-up (with `--live`, runs still being
written are followed and diagnosed again after every new step, dashboard/live.py: the page in
the browser redraws when they change); the browser picks one by its position in that list.
Pages live in `dashboard/pages/` (one module each), listed once in `dashboard.pages.PAGES`,
which the navigation, the router and the callbacks all read; their figures in
`dashboard/figures/` (one module a page), their data in `dashboard/data/`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dash import Dash, Input, Output, State, dcc, html, no_update

from dashboard.data import LoadedRun, load_runs, pick
from dashboard.live import LiveRuns
from dashboard.pages import PAGES, callbacks

ASSETS = Path(__file__).with_name("assets")


def create_app(
    runs: Sequence[LoadedRun | str | Path],
    config: dict[str, Any] | None = None,
    hta: bool = False,
    live_interval_s: float | None = None,
) -> Dash:
    """A Dash app over `runs` (loaded runs, or run directories / trace folders to load now with
    the rule thresholds in `config`, and HTA's analyses if `hta`); with `live_interval_s`, the
    run directories are followed as they grow, read again every that many seconds. Raises
    `diag.errors.InputError` on an unusable run."""
    loaded = [r for r in runs if isinstance(r, LoadedRun)]
    loaded += load_runs([r for r in runs if not isinstance(r, LoadedRun)], config, hta)
    if not loaded:
        raise ValueError("the dashboard needs at least one run")
    app = Dash(
        __name__,
        title="diag dashboard",
        assets_folder=str(ASSETS),
        serve_locally=True,
        suppress_callback_exceptions=True,  # page components come and go with the route
    )
    live = LiveRuns(loaded, config, live_interval_s).start() if live_interval_s else None
    app.layout = _shell(loaded, live_interval_s)
    _register_router(app, loaded)
    if live is not None:
        _register_live(app, live)
    for page in PAGES:
        register = callbacks(page)
        if register is not None:
            register(app, loaded)
    return app


def _shell(runs: Sequence[LoadedRun], live_interval_s: float | None = None) -> html.Div:
    nav = [dcc.Link(p.TITLE, href=p.PATH, className="nav-link") for p in PAGES]
    selector = dcc.Dropdown(
        id="run-select",
        options=[{"label": r.name, "value": i} for i, r in enumerate(runs)],
        value=0,
        clearable=False,
        className="run-select",
    )
    return html.Div(
        [
            dcc.Location(id="url"),
            dcc.Interval(
                id="live-tick",
                interval=int(1000 * (live_interval_s or 1)),
                disabled=live_interval_s is None,
            ),
            dcc.Store(id="live-version", data=0),
            html.Header(
                [html.Span("diag", className="brand"), html.Nav(nav), selector],
                className="header",
            ),
            html.Main(id="page"),
        ]
    )


def _register_router(app: Dash, runs: Sequence[LoadedRun]) -> None:
    by_path = {p.PATH: p for p in PAGES}

    @app.callback(
        Output("page", "children"),
        Input("url", "pathname"),
        Input("run-select", "value"),
        Input("live-version", "data"),  # a live run changed: draw the page again
    )
    def route(pathname: Any, run_index: Any, _version: Any) -> Any:
        page = by_path.get(pathname if isinstance(pathname, str) else PAGES[0].PATH)
        if page is None:
            return html.Div(f"no page at {pathname}", className="no-data")
        return page.layout(pick(runs, run_index), runs)


def _register_live(app: Dash, live: LiveRuns) -> None:
    @app.callback(
        Output("live-version", "data"),
        Input("live-tick", "n_intervals"),
        State("live-version", "data"),
    )
    def tick(_n: Any, shown: Any) -> Any:
        return live.version if live.version != shown else no_update


def serve(
    paths: Sequence[str],
    host: str = "127.0.0.1",
    port: int = 8050,
    config: dict[str, Any] | None = None,
    hta: bool = False,
    live_interval_s: float | None = None,
) -> None:
    """Load the runs and serve the dashboard until interrupted (`live_interval_s`: follow
    the runs still being written)."""
    app = create_app(paths, config, hta, live_interval_s)
    app.run(host=host, port=port, debug=False)
