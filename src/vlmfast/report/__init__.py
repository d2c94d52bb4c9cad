"""Rendering only: terminal tables and JSON, plots. Imports only the root leaves."""
