"""The dashboard's static files (HTML, CSS, ES modules), served by chunkstore.api.webui; no Python
runs here. A package so that it installs with its files as package data."""
