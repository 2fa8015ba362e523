"""Stage 6, emit: build-manifest.json, what made a wheel (pin, series, build series, target, tools, timings),
written beside the wheels and stamped into the vLLM wheel as the build's last step. Its file format
(name, schema, bytes) is ``g4build.wheelfile.manifestfile``, which the stages below read."""
