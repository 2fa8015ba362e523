"""Wheel files at the byte level: names, METADATA, RECORD, raw zip copying, the safety checks every reader of an
untrusted wheel runs first, and the file format of the build-manifest.json a g4build wheel carries."""
