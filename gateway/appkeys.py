"""Typed keys for what lives on the aiohttp application."""

from __future__ import annotations

from aiohttp import web

from backends.capture.host import TracerHub
from gateway.pipeline import Pipeline
from gateway.services import Services
from gateway.settings.model import Settings

SETTINGS = web.AppKey("settings", Settings)
SERVICES = web.AppKey("services", Services)
PIPELINE = web.AppKey("pipeline", Pipeline)
# Optional: host tracers owned by whoever made the app (its caller closes them); absent,
# the app makes its own hub and closes it with its backends.
TRACERS = web.AppKey("tracers", TracerHub)
