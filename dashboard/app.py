"""The Dash app shell: navigation, the run selector and a router over the pages.

    diag dashboard RUN [RUN ...] [--host 127.0.0.1] [--port 8050]

The runs are loaded, measured and diagnosed once, at start-up; the browser picks one by its
position in that list. Pages live in `dashboard/pages/` (one module each), listed once in
`dashboard.pages.PAGES`, which the navigation, the router and the callbacks all read; figures in
`dashboard/figures.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dash import Dash, Input, Output, dcc, html

from dashboard.data import LoadedRun, load_runs, pick
from dashboard.pages import PAGES, callbacks

ASSETS = Path(__file__).with_name("assets")


def create_app(
    runs: Sequence[LoadedRun | str | Path], config: dict[str, Any] | None = None, hta: bool = False
) -> Dash:
    """A Dash app over `runs` (loaded runs, or run directories / trace folders to load now with
    the rule thresholds in `config`, and HTA's analyses if `hta`). Raises
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
    app.layout = _shell(loaded)
    _register_router(app, loaded)
    for page in PAGES:
        register = callbacks(page)
        if register is not None:
            register(app, loaded)
    return app


def _shell(runs: Sequence[LoadedRun]) -> html.Div:
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
        Output("page", "children"), Input("url", "pathname"), Input("run-select", "value")
    )
    def route(pathname: Any, run_index: Any) -> Any:
        page = by_path.get(pathname if isinstance(pathname, str) else PAGES[0].PATH)
        if page is None:
            return html.Div(f"no page at {pathname}", className="no-data")
        return page.layout(pick(runs, run_index), runs)


def serve(
    paths: Sequence[str],
    host: str = "127.0.0.1",
    port: int = 8050,
    config: dict[str, Any] | None = None,
    hta: bool = False,
) -> None:
    """Load the runs and serve the dashboard until interrupted."""
    app = create_app(paths, config, hta)
    app.run(host=host, port=port, debug=False)
