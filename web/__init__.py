"""Serve an ember site: Pyodide, the ember wheel, the loader and the demos.

    python build.py demo                          # build the wheel and the site, then serve it
    python -m ember.web --site site [--host 127.0.0.1] [--port 8000]

``ember.web.site`` assembles the folder (layout in its docstring); ``ember.web.app.create_app``
is the Starlette app. Needs the optional dependencies ``starlette`` and ``uvicorn``
(``pip install ember[web]``); nothing else in ember imports this package.
"""
from __future__ import annotations


def create_app(site_dir):
    """The Starlette app serving `site_dir` (imported lazily: starlette is optional)."""
    from .app import create_app as _create

    return _create(site_dir)
