"""Stage 5, validate: read a built (or overlaid) wheel once and check it: name, metadata, RECORD, members, the
series it claims, CUDA fatbins per arch, and an optional install-and-import smoke test."""
