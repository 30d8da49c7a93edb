"""Typed keys for what lives on the aiohttp application."""

from __future__ import annotations

from aiohttp import web

from gateway.pipeline import Pipeline
from gateway.services import Services
from gateway.settings.model import Settings

SETTINGS = web.AppKey("settings", Settings)
SERVICES = web.AppKey("services", Services)
PIPELINE = web.AppKey("pipeline", Pipeline)
