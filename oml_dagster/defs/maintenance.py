"""Maintenance jobs and schedules (filled in by the maintenance work; empty for now)."""

MAINTENANCE_JOBS: list = []
MAINTENANCE_SCHEDULES: list = []
