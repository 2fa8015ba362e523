"""Stage 5, emit: build-manifest.json, what made a wheel, written beside the wheels and stamped into the vLLM
wheel as the build's last step (validation then reads it back)."""
