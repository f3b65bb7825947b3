"""The HTTP routes. Each route translates HTTP to one service call and back, nothing more."""

from __future__ import annotations

from fastapi import APIRouter

from gateway.routes import admin, health, inference, metrics, models

router = APIRouter()
router.include_router(health.router)
router.include_router(inference.router)
router.include_router(models.router)
router.include_router(metrics.router)
router.include_router(admin.router)
