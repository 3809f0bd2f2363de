"""The dashboard's widgets, one concern per module."""
