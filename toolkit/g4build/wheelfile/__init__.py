"""Wheels: read and check wheel files (RECORD, METADATA, CUDA fatbins) and lay patch series over them."""
